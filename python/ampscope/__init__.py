"""ampscope's Python side: the PyTorch recorder (ampscope.torch), run by `ampscope record -- python3 train.py`."""
