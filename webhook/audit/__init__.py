"""``gpu-admission audit``: judge what already runs against the policies and the GPU model, and report it.

Pure core: `findings` (the data), `checks` (GPU201-GPU215, consistency no admission policy can
check), `scan` (one run: the engine's validate policies and the checks over an inventory, exempt
namespaces, controller folding), `report` (PolicyReports and the write plan), `render` (table,
Markdown, HTML). Shells: `kube` (the kubernetes adapter), `sweep` (list, judge, write; shared by
the CLI and the background loop), `lease` and `background` (the periodic, leader-only audit inside
`serve`), `cli` (`audit`).
"""
