"""``radixlm serve-ray``: radixlm replicas on a Ray cluster behind Ray Serve (optional ``ray`` extra).

``cli.py`` (the command), ``app.py`` (deployments and the request router), ``ingress.py`` (HTTP to a
deployment call), ``replica.py`` (a radixlm server per Serve replica), ``routing_key.py`` (what the
prefix-affinity router matches). Importing this package imports no Ray; the modules that need it
import it inside functions.
"""
