"""stunner_api: the pure, shared models of STUNner (the v1 dataplane config in `dataplane`).

Imported by stunnerd, the admission webhook and the operator; imports none of them, and does no
I/O of its own.
"""
