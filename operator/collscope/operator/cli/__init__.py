"""The ``collscope`` command line: one module per subcommand family, ``main`` parses and
dispatches. Runs offline (bundles, the simulators, the one-box) or against a cluster (``nodes``,
``uncordon``); never part of the operator's daemon."""
