"""`envhub sandbox build|ls|gc`: build the offline base image, list and clean up sandbox containers."""

from __future__ import annotations

import argparse


def _cmd_build(args: argparse.Namespace) -> int:
    from envhub.sandboxes.images import build_base_image

    report = build_base_image(force=args.force)
    if report.cached:
        print(f"{report.tag} is up to date ({report.size_bytes / 1e6:.0f} MB; rootfs {report.rootfs})")
    else:
        print(
            f"built {report.tag}: rootfs {report.rootfs_seconds:.1f} s, docker import {report.import_seconds:.1f} s, "
            f"{report.size_bytes / 1e6:.0f} MB"
        )
    return 0


def _cmd_ls(args: argparse.Namespace) -> int:
    from envhub.sandboxes.docker_backend import LABEL_OWNER, LABEL_POOL, LABEL_SANDBOX, shared_client

    client = shared_client()
    for image in client.images.list(name="envhub/*"):
        print(f"image      {', '.join(image.tags) or image.short_id:<40} {image.attrs['Size'] / 1e6:.0f} MB")
    for container in client.api.containers(all=True, filters={"label": LABEL_SANDBOX}):
        labels = container.get("Labels") or {}
        name = (container.get("Names") or ["?"])[0].lstrip("/")
        print(
            f"container  {name:<40} {container.get('State', '?'):<10} pool={labels.get(LABEL_POOL, '-')} "
            f"owner_pid={labels.get(LABEL_OWNER, '-')}"
        )
    return 0


def _cmd_gc(args: argparse.Namespace) -> int:
    from envhub.sandboxes.bwrap_backend import remove_orphan_dirs
    from envhub.sandboxes.docker_backend import remove_orphans

    removed = remove_orphans(all_sandboxes=args.all)
    dirs = remove_orphan_dirs()
    print(f"removed {len(removed)} sandbox containers and {len(dirs)} bwrap workdirs")
    if args.images:
        from envhub.sandboxes.images import remove_built_images

        print(f"removed {len(remove_built_images())} images envhub built (label envhub.image)")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register `envhub sandbox ...`."""
    parser = sub.add_parser("sandbox", help="build sandbox images, list or clean up sandboxes")
    commands = parser.add_subparsers(dest="sandbox_command", metavar="ACTION", required=True)
    p = commands.add_parser(
        "build", help="build the base image offline (debootstrap + docker import); a no-op when cached"
    )
    p.add_argument("--force", action="store_true", help="rebuild the image even when it exists")
    p.set_defaults(handler=_cmd_build)
    p = commands.add_parser("ls", help="list envhub images and sandbox containers")
    p.set_defaults(handler=_cmd_ls)
    p = commands.add_parser("gc", help="remove sandboxes whose owner process died")
    p.add_argument("--all", action="store_true", help="remove every envhub sandbox container, live owners too")
    p.add_argument(
        "--images", action="store_true", help="also remove the images envhub built for SWE instances (unused ones)"
    )
    p.set_defaults(handler=_cmd_gc)
