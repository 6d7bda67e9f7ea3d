"""The operator's daemon: the kopf handlers (TrainingJob, Diagnosis, profiling), the trigger
loop, the admission webhook, evidence collection and the remediator that acts on nodes.
Everything that reacts to the cluster lives here; what it decides with lives in ``domain`` and
``analysis``."""
