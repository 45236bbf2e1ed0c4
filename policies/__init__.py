"""Pure GPU policy evaluation: the vocabulary, the engine and the built-in policies (no I/O).

Modules, for callers outside the package:

- `engine`: `evaluate(request, *, settings) -> model.Decision` and `POLICIES` (the registry);
- `model`: the request, decision and result types;
- `settings`: `Settings()` defaults and `from_mapping(document)`: actions, namespace overrides,
  exceptions with expiry (`expired_exceptions`), GPU parameters;
- `cel`: user policies (GpuAdmissionPolicy documents) compiled into validators that
  `settings.user_policies` hands to the engine;
- `gpu`: every label, resource, mode and annotation key of the GPU model;
- `inventory`, `allocation`, `reservations`, `usage`: the GPU model's annotation formats, one codec
  each (the labeler's cards, links and real use on a Node; what a pod holds; the extender's ledger);
- `cardrequest`, `podrequests`: what a pod asks of the scheduler extender, counted as Kubernetes does;
- `podspec`: the pod template of Pods and workloads, and their containers with JSON pointers;
- `nodeaffinity`, `patching`: node-constraint reading and RFC 6902 `add` operations.

`policy` and `builtin` are the policies' own base shapes and modules.
"""
