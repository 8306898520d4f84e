"""The student's modules: the model, its data, sampling and the report."""
