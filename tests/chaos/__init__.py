"""The fault-injection suite: candidates on a private store, a seeded nemesis, a checker.

``python -m tests.chaos --store redis --duration 600 --seed 1 --report docs/chaos/``; see
docs/chaos.md. Modules: :mod:`.harness` (processes and the nemesis), :mod:`.stores`
(private store instances and their faults), :mod:`.candidate` and :mod:`.payload` (the
candidate processes), :mod:`.checker` (pure, over the logs), :mod:`.report`.
"""
