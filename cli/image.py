"""``det image build``: the default task image (see :mod:`det.agent.image`)."""

import docker
import docker.errors
import typer

from det.agent.image import DEFAULT_IMAGE, build_default_image
from det.errors import ImageError

app = typer.Typer(no_args_is_help=True)


@app.command("build")
def build(
    offline: bool = typer.Option(
        False, "--offline/--online",
        help="Base the image on a debootstrapped Debian bookworm (needs root and debootstrap) "
             "instead of pulling python:3.11-slim."),
    tag: str = typer.Option(DEFAULT_IMAGE, "--tag", help="Tag of the image built."),
    mirror: str | None = typer.Option(None, "--mirror", envvar="DET_DEBIAN_MIRROR",
                               help="Debian mirror for --offline (default: deb.debian.org)."),
) -> None:
    """Build the task image: Python 3.11 with det and torch, from wheels made by this host's pip."""
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as e:
        raise ImageError(f"cannot reach the Docker engine ({e}); start dockerd or set "
                         f"DOCKER_HOST") from e
    build_default_image(client, tag, offline=offline, mirror=mirror, log=typer.echo)
    typer.echo(f"Built {tag}")
