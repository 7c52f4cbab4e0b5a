#!/usr/bin/env python3
"""Packs a root file system directory into a single-layer OCI image archive.

Used by hack/build-images.sh: no registry is reachable from the test hosts, so the
images Crab's demo and tests run are assembled locally and loaded with
`ctr images import` (the OCI layout: index.json) or `docker load` (Docker's
manifest.json, which Docker's overlay2 store needs; the same blobs, as `docker save`
writes since Docker 25). Standard library only.

The layer is reproducible: entries are sorted, every mtime is fixed (SOURCE_DATE_EPOCH,
default 0), user and group names are dropped, and uid/gid/mode/symlinks/hard links
are taken from the files themselves. Device nodes and sockets are skipped (the
runtime provides /dev).

    oci-image.py --rootfs DIR --name docker.io/crab/busybox:latest \
                 --cmd '["sh"]' --env PATH=... --output busybox.tar
"""

import argparse
import gzip
import hashlib
import json
import os
import stat
import sys
import tarfile
import tempfile
import time

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"


class HashingWriter:
    """File-like sink that hashes and counts what passes through it."""

    def __init__(self, sink):
        self.sink = sink
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data):
        self.sha.update(data)
        self.size += len(data)
        return self.sink.write(data)

    def flush(self):
        self.sink.flush()

    def digest(self):
        return "sha256:" + self.sha.hexdigest()


def walk(root):
    """Yields (absolute path, archive name) for root's contents, parents first, sorted."""
    stack = [("", root)]
    while stack:
        rel, path = stack.pop()
        with os.scandir(path) as it:
            names = sorted(e.name for e in it)
        children = []
        for name in names:
            child_rel = f"{rel}/{name}" if rel else name
            child = os.path.join(path, name)
            yield child, child_rel
            st = os.lstat(child)
            if stat.S_ISDIR(st.st_mode):
                children.append((child_rel, child))
        # Depth first, in sorted order.
        stack.extend(reversed(children))


def write_layer(rootfs, out, mtime):
    """Writes the gzip layer to `out`; returns (diff_id, digest, size)."""
    compressed = HashingWriter(out)
    skipped = []
    with gzip.GzipFile(filename="", mode="wb", fileobj=compressed, mtime=mtime,
                       compresslevel=6) as gz:
        plain = HashingWriter(gz)
        with tarfile.open(fileobj=plain, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for path, name in walk(rootfs):
                st = os.lstat(path)
                if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)
                        or stat.S_ISLNK(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
                    skipped.append(name)
                    continue
                info = tar.gettarinfo(path, arcname=name)
                info.mtime = mtime
                info.uname = ""
                info.gname = ""
                info.pax_headers = {}
                if info.isreg():
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    if skipped:
        print(f"oci-image: skipped {len(skipped)} device/socket entries "
              f"(e.g. {', '.join(skipped[:3])})", file=sys.stderr)
    return plain.digest(), compressed.digest(), compressed.size


def add_blob(layout, data):
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    with open(os.path.join(layout, "blobs", "sha256", digest[7:]), "wb") as f:
        f.write(data)
    return digest, len(data)


def familiar(name):
    """Docker's short form of an image name: docker.io/library/x:t -> x:t."""
    for prefix in ("docker.io/library/", "docker.io/"):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def write_archive(layout, output, mtime):
    """Tars the OCI layout directory deterministically into `output`."""
    with tarfile.open(output, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, name in walk(layout):
            info = tar.gettarinfo(path, arcname=name)
            info.mtime = mtime
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mode = 0o755 if info.isdir() else 0o644
            if info.isreg():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rootfs", required=True)
    p.add_argument("--name", required=True, help="full image name, e.g. docker.io/crab/busybox:latest")
    p.add_argument("--output", required=True)
    p.add_argument("--cmd", default="[]", help="JSON array")
    p.add_argument("--entrypoint", default=None, help="JSON array")
    p.add_argument("--env", action="append", default=[])
    p.add_argument("--workdir", default="/")
    p.add_argument("--user", default="")
    p.add_argument("--arch", default="amd64")
    p.add_argument("--os", default="linux")
    args = p.parse_args()

    mtime = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(mtime))
    ref = args.name.rsplit(":", 1)[1] if ":" in args.name.rsplit("/", 1)[-1] else "latest"

    out_dir = os.path.dirname(os.path.abspath(args.output))
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".oci-") as layout:
        blobs = os.path.join(layout, "blobs", "sha256")
        os.makedirs(blobs)

        tmp_layer = os.path.join(blobs, "layer.tmp")
        with open(tmp_layer, "wb") as f:
            diff_id, layer_digest, layer_size = write_layer(args.rootfs, f, mtime)
        os.rename(tmp_layer, os.path.join(blobs, layer_digest[7:]))

        container_config = {"Env": args.env, "Cmd": json.loads(args.cmd), "WorkingDir": args.workdir}
        if args.entrypoint:
            container_config["Entrypoint"] = json.loads(args.entrypoint)
        if args.user:
            container_config["User"] = args.user
        config = {
            "created": created,
            "architecture": args.arch,
            "os": args.os,
            "config": container_config,
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created": created, "created_by": "hack/build-images.sh"}],
        }
        config_digest, config_size = add_blob(layout, canonical(config))

        manifest = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": config_digest, "size": config_size},
            "layers": [{"mediaType": OCI_LAYER_GZIP, "digest": layer_digest, "size": layer_size}],
        }
        manifest_digest, manifest_size = add_blob(layout, canonical(manifest))

        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [{
                "mediaType": OCI_MANIFEST,
                "digest": manifest_digest,
                "size": manifest_size,
                "platform": {"architecture": args.arch, "os": args.os},
                "annotations": {
                    "io.containerd.image.name": args.name,
                    "org.opencontainers.image.ref.name": ref,
                },
            }],
        }
        with open(os.path.join(layout, "index.json"), "wb") as f:
            f.write(canonical(index))
        # Docker's archive manifest, for `docker load` with a graph driver (overlay2).
        docker_manifest = [{
            "Config": "blobs/sha256/" + config_digest[7:],
            "RepoTags": [familiar(args.name)],
            "Layers": ["blobs/sha256/" + layer_digest[7:]],
        }]
        with open(os.path.join(layout, "manifest.json"), "wb") as f:
            f.write(canonical(docker_manifest))
        with open(os.path.join(layout, "oci-layout"), "wb") as f:
            f.write(canonical({"imageLayoutVersion": "1.0.0"}))

        tmp_out = args.output + ".tmp"
        write_archive(layout, tmp_out, mtime)
        os.replace(tmp_out, args.output)

    print(f"{args.name}: {manifest_digest} (layer {layer_size} bytes compressed)")


if __name__ == "__main__":
    main()
