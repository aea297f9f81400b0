"""Replicas found at run time: DNS records of a headless Service, or the Kubernetes API.

``config`` holds the YAML shape of a source, ``targets`` turns what a source found into
replica configs, ``dns_source`` and ``kube_source`` watch their backends, and ``runner``
owns their tasks and applies every change through ``gateway.membership``.
"""
