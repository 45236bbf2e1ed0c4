"""Engine settings: action per policy, exempt namespaces and the GPU-mode parameters."""

# CONTRACT (owned by the policies helper; keep these names and signatures):
#   Settings                       frozen dataclass, Settings() is the built-in default
#   from_mapping(data) -> Settings parses the already-loaded YAML document
#   InvalidSettings(ValueError)    raised with a one-line message naming the field
