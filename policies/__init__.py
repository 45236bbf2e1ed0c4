"""Pure GPU policy evaluation: the vocabulary, the engine and the built-in policies (no I/O).

Modules, for callers outside the package:

- `engine`: `evaluate(request, *, settings) -> model.Decision` and `POLICIES` (the registry);
- `model`: the request, decision and result types;
- `settings`: `Settings()` defaults and `from_mapping(document)`: actions, namespace overrides,
  exceptions with expiry (`expired_exceptions`), GPU parameters;
- `cel`: user policies (GpuAdmissionPolicy documents) compiled into validators that
  `settings.user_policies` hands to the engine;
- `gpu`: every label, resource, mode and annotation key of the GPU model;
- `podspec`: the pod template of Pods and workloads, and their containers with JSON pointers;
- `nodeaffinity`, `patching`: node-constraint reading and RFC 6902 `add` operations.

`policy` and `builtin` are the policies' own base shapes and modules.
"""
