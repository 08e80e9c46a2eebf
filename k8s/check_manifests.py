#!/usr/bin/env python3
"""Validates rendered Kubernetes manifests offline; run by k8s/validate.sh.

Usage: check_manifests.py --k8s-version V... [--external KIND/NAME]... [--base] [--standalone] FILE...

Each FILE is one rendering (the output of `kubectl kustomize DIR`, or a plain manifest with
--standalone). Every object is validated against the Kubernetes JSON schemas bundled with
kubernetes-validate, strictly (an unknown field is an error, and so is a kind or apiVersion
the schemas do not know), for every --k8s-version. Then the rules this project holds its
manifests to:

  * every container of a Deployment, Job or CronJob (and any other pod template) runs as
    non-root with a read-only root filesystem, no privilege escalation, every capability
    dropped, the RuntimeDefault seccomp profile; no service-account token, no service links;
    memory and CPU requests and a memory limit; no `:latest` image, and outside a --base
    (whose image is a placeholder an overlay replaces) no image without a tag or digest;
  * every container that opens a keyspace (its environment comes from the Redis Secret) names
    a fingerprint key file (NAMELIST_FINGERPRINT_KEY_FILE) inside one of its volume mounts,
    from a Secret volume that no other user may read (no world bits in its mode);
  * a Deployment has startup, liveness and readiness probes, `maxUnavailable: 0`, a grace
    period of at least 30 s, and no `replicas` when an HPA scales it;
  * within one rendering, everything referenced exists: the ConfigMaps, Secrets and PVCs a pod
    uses (but for --external ones, created out of band), the ServiceAccount, the HPA's target,
    and the pods that each Service, PodDisruptionBudget and NetworkPolicy selects; every named
    port a Service or NetworkPolicy uses is a container port of the pods it selects;
  * with a Namespace object in the rendering, every namespaced object is in it.

Exit status 1 when anything fails; every failure is printed.
"""

import argparse
import sys

import yaml
import kubernetes_validate
from kubernetes_validate import SchemaNotFoundError, InvalidSchemaError, ValidationError

POD_TEMPLATE_PATHS = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "PersistentVolume",
    "StorageClass",
    "PriorityClass",
    "CustomResourceDefinition",
}


def dig(obj, *path, default=None):
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return default
        obj = obj[key]
    return obj


def name_of(obj):
    return "%s/%s" % (obj.get("kind"), dig(obj, "metadata", "name", default="?"))


def selects(selector, labels):
    """matchLabels/matchExpressions (or a Service's plain map) against a label map."""
    if selector is None:
        return False
    if "matchLabels" not in selector and "matchExpressions" not in selector:
        return all(labels.get(k) == v for k, v in selector.items())
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


class Checker:
    def __init__(self, versions, external):
        self.versions = versions
        self.external = set(external)
        self.errors = []
        self.objects = 0

    def fail(self, where, msg):
        self.errors.append("%s: %s" % (where, msg))

    # --- schemas -------------------------------------------------------------------------
    def schema(self, where, obj):
        """True when `obj` is valid for every version."""
        before = len(self.errors)
        for version in self.versions:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except ValidationError as e:
                path = ".".join(str(p) for p in e.path) or "(top)"
                self.fail(where, "schema %s: %s: %s" % (version, path, e.message))
            except (SchemaNotFoundError, InvalidSchemaError) as e:
                self.fail(where, "schema %s: %s" % (version, e.message))
        return len(self.errors) == before

    # --- pods ----------------------------------------------------------------------------
    def pod(self, where, spec, in_base):
        psc = spec.get("securityContext") or {}
        if spec.get("automountServiceAccountToken") is not False:
            self.fail(where, "automountServiceAccountToken must be false")
        if spec.get("enableServiceLinks") is not False:
            self.fail(where, "enableServiceLinks must be false")
        if dig(psc, "seccompProfile", "type") != "RuntimeDefault":
            self.fail(where, "pod seccompProfile must be RuntimeDefault")
        if psc.get("runAsUser") == 0:
            self.fail(where, "pod runAsUser is 0")
        containers = (spec.get("initContainers") or []) + (spec.get("containers") or [])
        for c in containers:
            cw = "%s container %s" % (where, c.get("name"))
            sc = c.get("securityContext") or {}

            def eff(key, sc=sc):
                return sc.get(key, psc.get(key))

            if eff("runAsNonRoot") is not True:
                self.fail(cw, "runAsNonRoot must be true")
            if eff("runAsUser") in (None, 0):
                self.fail(cw, "runAsUser must be a non-zero UID")
            if sc.get("readOnlyRootFilesystem") is not True:
                self.fail(cw, "readOnlyRootFilesystem must be true")
            if sc.get("allowPrivilegeEscalation") is not False:
                self.fail(cw, "allowPrivilegeEscalation must be false")
            if sc.get("privileged"):
                self.fail(cw, "must not be privileged")
            if "ALL" not in (dig(sc, "capabilities", "drop") or []):
                self.fail(cw, "capabilities must drop ALL")
            if dig(sc, "capabilities", "add"):
                self.fail(cw, "must add no capability")
            res = c.get("resources") or {}
            for key in ("cpu", "memory"):
                if key not in (res.get("requests") or {}):
                    self.fail(cw, "no %s request" % key)
            if "memory" not in (res.get("limits") or {}):
                self.fail(cw, "no memory limit")
            image = c.get("image", "")
            last = image.rsplit("/", 1)[-1]
            if image.endswith(":latest"):
                self.fail(cw, "image %s: pin a tag or digest, not latest" % image)
            elif not in_base and ":" not in last and "@" not in image:
                self.fail(cw, "image %s has no tag or digest" % image)
            self.fingerprint_key(cw, c, spec)

    def fingerprint_key(self, cw, c, spec):
        """A container that opens a keyspace has the key, from a Secret no other user may read."""
        redis = any(
            (src.get("secretRef") or {}).get("name", "").startswith("namelist-redis")
            for src in c.get("envFrom") or []
        )
        if not redis:
            return
        path = next(
            (e.get("value") for e in c.get("env") or [] if e.get("name") == "NAMELIST_FINGERPRINT_KEY_FILE"),
            None,
        )
        if not path:
            self.fail(cw, "opens a keyspace but sets no NAMELIST_FINGERPRINT_KEY_FILE")
            return
        mount = next(
            (m for m in c.get("volumeMounts") or [] if path.startswith(m.get("mountPath", "").rstrip("/") + "/")),
            None,
        )
        vol = mount and next((v for v in spec.get("volumes") or [] if v.get("name") == mount.get("name")), None)
        source = vol and (vol.get("secret") or vol.get("projected"))
        if not source:
            self.fail(cw, "NAMELIST_FINGERPRINT_KEY_FILE %s is not in a Secret volume it mounts" % path)
        elif source.get("defaultMode", 0o644) & 0o004:
            self.fail(cw, "the fingerprint key volume %s is world-readable (defaultMode)" % vol.get("name"))

    def pod_refs(self, where, spec, have):
        def need(kind, name):
            if name and (kind, name) not in have and "%s/%s" % (kind, name) not in self.external:
                self.fail(where, "refers to %s %s, which is not in this rendering" % (kind, name))

        sa = spec.get("serviceAccountName")
        if sa and sa != "default":
            need("ServiceAccount", sa)
        for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
            for src in c.get("envFrom") or []:
                if "configMapRef" in src and not src["configMapRef"].get("optional"):
                    need("ConfigMap", src["configMapRef"].get("name"))
                if "secretRef" in src and not src["secretRef"].get("optional"):
                    need("Secret", src["secretRef"].get("name"))
            for env in c.get("env") or []:
                vf = env.get("valueFrom") or {}
                if "configMapKeyRef" in vf and not vf["configMapKeyRef"].get("optional"):
                    need("ConfigMap", vf["configMapKeyRef"].get("name"))
                if "secretKeyRef" in vf and not vf["secretKeyRef"].get("optional"):
                    need("Secret", vf["secretKeyRef"].get("name"))
        for vol in spec.get("volumes") or []:
            if "configMap" in vol and not vol["configMap"].get("optional"):
                need("ConfigMap", vol["configMap"].get("name"))
            if "secret" in vol and not vol["secret"].get("optional"):
                need("Secret", vol["secret"].get("secretName"))
            for src in dig(vol, "projected", "sources", default=None) or []:
                if "secret" in src and not src["secret"].get("optional"):
                    need("Secret", src["secret"].get("name"))
                if "configMap" in src and not src["configMap"].get("optional"):
                    need("ConfigMap", src["configMap"].get("name"))
            if "persistentVolumeClaim" in vol:
                need("PersistentVolumeClaim", vol["persistentVolumeClaim"].get("claimName"))
        # The rendered objects already carry their final (hash-suffixed) names.

    # --- one rendering -------------------------------------------------------------------
    def rendering(self, filename, standalone, in_base):
        with open(filename) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        if not docs:
            self.fail(filename, "no objects")
            return
        have = {(d.get("kind"), dig(d, "metadata", "name")) for d in docs}
        namespaces = [dig(d, "metadata", "name") for d in docs if d.get("kind") == "Namespace"]
        templates = []  # (object, pod template)
        for d in docs:
            self.objects += 1
            where = "%s %s" % (filename, name_of(d))
            tpl = dig(d, *POD_TEMPLATE_PATHS.get(d.get("kind"), ("-",)))
            if isinstance(tpl, dict):
                templates.append((d, tpl))
            if not self.schema(where, d):
                continue  # the rules below assume well-formed objects
            try:
                self.rules(where, d, docs, have, namespaces, standalone, in_base)
            except Exception as e:  # a rule tripping over an odd object is a failure too
                self.fail(where, "rule check crashed: %r" % e)
        if standalone:
            return
        self.relations(filename, docs, have, templates)

    def rules(self, where, d, docs, have, namespaces, standalone, in_base):
        kind = d.get("kind")
        if namespaces and kind not in CLUSTER_SCOPED:
            ns = dig(d, "metadata", "namespace")
            if ns not in namespaces:
                self.fail(where, "namespace %r, not the rendering's %s" % (ns, namespaces))
        if kind in POD_TEMPLATE_PATHS:
            tpl = dig(d, *POD_TEMPLATE_PATHS[kind]) or {}
            spec = tpl.get("spec") or {}
            self.pod(where, spec, in_base)
            if not standalone:
                self.pod_refs(where, spec, have)
        if kind == "Deployment":
            self.deployment(where, d, docs)

    def relations(self, filename, docs, have, templates):
        def pods_selected(selector):
            return [(o, t) for o, t in templates if selects(selector, dig(t, "metadata", "labels") or {})]

        def port_names(pods):
            return {
                p.get("name")
                for _, t in pods
                for c in dig(t, "spec", "containers") or []
                for p in c.get("ports") or []
            }

        for d in docs:
            where = "%s %s" % (filename, name_of(d))
            kind = d.get("kind")
            if kind == "Service" and dig(d, "spec", "selector"):
                pods = pods_selected(dig(d, "spec", "selector"))
                if not pods:
                    self.fail(where, "selects no pod template")
                for port in dig(d, "spec", "ports") or []:
                    tp = port.get("targetPort")
                    if isinstance(tp, str) and tp not in port_names(pods):
                        self.fail(where, "targetPort %s is no container port of its pods" % tp)
            if kind in ("PodDisruptionBudget", "NetworkPolicy"):
                key = "selector" if kind == "PodDisruptionBudget" else "podSelector"
                pods = pods_selected(dig(d, "spec", key))
                if not pods:
                    self.fail(where, "selects no pod template")
                if kind == "NetworkPolicy":
                    for rule in dig(d, "spec", "ingress") or []:
                        for port in rule.get("ports") or []:
                            p = port.get("port")
                            if isinstance(p, str) and p not in port_names(pods):
                                self.fail(where, "ingress port %s is no container port of its pods" % p)
            if kind == "HorizontalPodAutoscaler":
                ref = dig(d, "spec", "scaleTargetRef") or {}
                if (ref.get("kind"), ref.get("name")) not in have:
                    self.fail(where, "scales %s/%s, not in this rendering" % (ref.get("kind"), ref.get("name")))

    def deployment(self, where, d, docs):
        spec = d.get("spec") or {}
        name = dig(d, "metadata", "name")
        scaled = any(
            o.get("kind") == "HorizontalPodAutoscaler"
            and dig(o, "spec", "scaleTargetRef", "kind") == "Deployment"
            and dig(o, "spec", "scaleTargetRef", "name") == name
            for o in docs
        )
        if scaled and "replicas" in spec:
            self.fail(where, "sets replicas although an HPA scales it (every apply would reset it)")
        if dig(spec, "strategy", "rollingUpdate", "maxUnavailable") not in (0, "0%"):
            self.fail(where, "rollingUpdate.maxUnavailable must be 0")
        pod = dig(spec, "template", "spec") or {}
        if (pod.get("terminationGracePeriodSeconds") or 30) < 30:
            self.fail(where, "terminationGracePeriodSeconds below 30")
        for c in pod.get("containers") or []:
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                if probe not in c:
                    self.fail(where, "container %s has no %s" % (c.get("name"), probe))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--k8s-version", action="append", required=True)
    ap.add_argument("--external", action="append", default=[],
                    help="KIND/NAME that may be referenced without being rendered")
    ap.add_argument("--base", action="store_true",
                    help="a base: its images are placeholders an overlay replaces")
    ap.add_argument("--standalone", action="store_true",
                    help="plain manifests: schemas and pod rules only, no cross-references")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    checker = Checker(args.k8s_version, args.external)
    for filename in args.files:
        before = (checker.objects, len(checker.errors))
        checker.rendering(filename, args.standalone, args.base)
        for e in checker.errors[before[1]:]:
            print("ERROR " + e, flush=True)
        print("  %-48s %3d objects, %d errors" % (
            filename, checker.objects - before[0], len(checker.errors) - before[1]), flush=True)
    return 1 if checker.errors else 0


if __name__ == "__main__":
    sys.exit(main())
