"""The scheduler extender: places GPU-sharing pods on a node and a card (DESIGN section 3).

Pure core: `wire` (the extender/v1 wire format), `topology` (card links), `cards` (per-node card
model and allocation state from pods and nodes), `placement` (filter, score, choose), `inspection`
(the `kubectl inspect cgpu` table). Shells: `kube` (the kubernetes client adapter and watch cache),
`binder` (the compare-and-swap bind protocol), `app` (aiohttp), `cli` (`extender`, `inspect`).
"""
