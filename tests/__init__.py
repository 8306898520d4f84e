"""The test suite, in folders that mirror the code (README: Tests); helpers in tests/support/."""
