"""Certificates in the cluster and as files: the webhook's and the extender's, and their renewal."""
