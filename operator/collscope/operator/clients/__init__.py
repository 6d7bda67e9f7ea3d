"""The operator's clients of other processes: the node agents' HTTP API (``agents``) and the
Kubernetes API (``kube``). Each hides its transport behind a small typed interface."""
