"""A placement written in other engines' terms: llama.cpp's arguments, SGLang, vLLM, lucebox, ktransformers."""
