"""The window's state as small models without Qt: plain objects with listeners, tested without a window
(tests/test_window_models.py). app/state.py adapts them to Qt signals; nothing here imports Qt."""
