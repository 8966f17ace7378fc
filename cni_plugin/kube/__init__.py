"""A small Kubernetes API client: kubeconfig loading, typed errors, retries within a deadline.

Written on the standard library (http.client + ssl) instead of the `kubernetes` package, whose
import alone costs about half a second on every CNI invocation.
"""
