"""Pure GPU policy evaluation: the GPU model, the engine and the built-in policies (no I/O).

Two rooms, and the pod-shape helpers both use:

- `gpu` (a package): the GPU model. `gpu` itself is the vocabulary (every label, resource, mode and
  annotation key); beside it the annotation formats, one codec each (`inventory`, `allocation`,
  `reservations`, `usage`), what a pod asks and holds (`cardrequest`, `podrequests`, `cardmodel`,
  `quantity`, `podparse`), Dynamic Resource Allocation (`dra`), the extender's node state
  (`cards`), its reason codes (`reasons`) and the `inspect` views (`inspection`). The scheduler
  extender, the labeler and `explain` use only this room; it imports nothing of the policy
  machinery (an import-linter contract).
- The policy machinery, for callers outside the package:
  - `engine`: `evaluate(request, *, settings) -> model.Decision` and `POLICIES` (the registry);
  - `model`: the request, decision and result types;
  - `settings` (a package, one module per section): `Settings()` defaults and
    `from_mapping(document)`: actions, namespace overrides, exceptions with expiry
    (`expired_exceptions`), GPU parameters;
  - `cel`: user policies (GpuAdmissionPolicy documents) compiled into validators that
    `settings.user_policies` hands to the engine;
  - `policy` and `builtin`: the policies' own base shapes and modules; `applicability`, `trustzone`,
    `ordinary`, `nodeaffinity`, `hostpaths`, `envsources`, `schedulers`, `lookups`, `replicas`: what
    they judge with.
- `podspec`, `patching`: the pod template of Pods and workloads, their containers with JSON
  pointers, and RFC 6902 `add` operations.
"""
