"""The ``ptq-protein`` command line."""
