"""What both halves stand on, torch-free: the schema engine and its errors, the trainer's configuration (which the
launcher checks every run against before submitting), and writes that a crash cannot leave half done.

Imports nothing else of tinygpt.
"""
