"""The control plane in a box: real Kubernetes and Argo, built from the Go module proxy, on loopback.

- :mod:`box.build`: builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler, Argo's workflow-controller,
  argoexec and the argo CLI once per pinned version (``tests/box/k8s``, ``tests/box/argo``);
- :mod:`box.controlplane`: starts them (RBAC on, service-account tokens, Argo's CRDs; the real scheduler places pods);
- :mod:`box.kubelet`: a process kubelet that runs the containers of the pods bound to its nodes as local processes;
- :mod:`box.scenarios`: the conformance scenarios on the rendered templates, and the local runner beside them.

``make box`` starts one for interactive use; the tests marked ``argo`` start one per session.
"""
