"""The policy engine: mutate, then validate the mutated object, and return one decision."""

# CONTRACT (owned by the policies helper; keep these names and signatures):
#   evaluate(request: model.Request, *, settings: settings.Settings) -> model.Decision
#     - request.object may be a Pod or a workload (Deployment, StatefulSet, DaemonSet, ReplicaSet,
#       ReplicationController, Job, CronJob); for a workload the policies run on its pod template and
#       the patch paths point into the workload object.
#     - never raises: a crashing policy becomes Result.ERROR and a Violation with its action.
#     - Decision.patch applies cleanly with jsonpatch to request.object; a second evaluate on the
#       patched object returns an empty patch.
