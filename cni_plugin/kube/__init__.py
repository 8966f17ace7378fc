"""What every room shares of Kubernetes: a small API client (`client`: typed errors, retries within
a deadline, watches), kubeconfig loading (`config`), the verb's one session (`session`), a
list+watch of one collection kept in memory (`watch`), the kinds more than one room reads
(`kinds`), the Pod's network-selection elements (`networks`), and an Event's body (`events`).

Written on the standard library (http.client + ssl) instead of the `kubernetes` package, whose
import alone costs about half a second on every CNI invocation.
"""
