"""The code's shape and the test suite's own machinery."""
