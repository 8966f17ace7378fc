"""Kernel primitives: network namespaces, links, addresses, routes, isolation, sysctls."""
