"""The operator's domain: what a TrainingJob, a Diagnosis, a policy, a circuit breaker, a pod
contract and a status are, without kopf, Kubernetes clients or HTTP (an import-linter contract
keeps it so). The controller and the CLI share it."""
