"""Not imported as a package: this directory goes on the training pod's ``PYTHONPATH`` so that
Python's ``site`` module runs its ``sitecustomize.py`` at start-up."""
