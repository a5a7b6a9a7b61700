"""The Kubernetes API, as the components that read it need it: where it is and who we are to it
(``access``), a list and a watch over HTTP (``client``), and a local copy of one collection kept
current (``watch``). Used by the k8sattributes processor, the k8s resource detector and the
load_balancing exporter's k8s resolver."""
