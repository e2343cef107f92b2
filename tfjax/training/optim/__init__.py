"""What the step minimizes and how: the optimizer and learning-rate schedules (optimizer.py) and
the float32 token and classification losses (losses.py)."""
