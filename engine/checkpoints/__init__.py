"""Reading what a model is made of: Hugging Face folders, GGUF files, their config, the demo pair."""
