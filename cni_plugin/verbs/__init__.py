"""The CNI verbs as plain functions over typed inputs (SPEC §2), one recipe each: `add`,
`delete`, `check`, `status`, `gc`, `version`. What they share: `collaborators` (what a
transport lends them: the cluster source, the link remover, observers) and `facts` (what the
attachment helpers take, picked out of the Invocation once).
"""
