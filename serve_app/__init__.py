"""The application: the HTTP edge (``http/``) and the builder ``app`` that binds every deployment,
the top floor (``tests/test_layers.py``)."""
