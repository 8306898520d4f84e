"""What both halves stand on: the schema, the trainer's configuration, bad input and damaged files."""
