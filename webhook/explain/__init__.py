"""Why a GPU pod is pending, and what would happen to a batch: `explain`, `snapshot`, `simulate`, `defrag`.

`predicates` (kube-scheduler's node checks the extender never sees: cordon, taints, selectors),
`analysis` (one pod against every GPU node, with the extender's own placement), `simulate` (a batch
placed in order on a copy of the allocation), `snapshot` (nodes, pods, the ledger Leases and reservations
saved for offline use), `render` (table, JSON, YAML), `cli` (the commands).
"""
