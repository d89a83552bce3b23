module llog.local/kustomize-tool

go 1.26.0

require sigs.k8s.io/kustomize/kustomize/v5 v5.8.2
