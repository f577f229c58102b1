"""The pool, image, Azure and deployment pages (docs/guides/azure.md, docker-pool.md, deployments.md,
docs/concepts/pools-and-images.md) and the comments of flows/configs/azure.yaml hold what the code and the
templates say: the variables the written config needs are the ones the Azure guide exports, the registry has no
admin user, the error lines quoted are the ones the code prints, and every `trainflow` line parses. Pure reads:
nothing starts, nothing is reached over a network."""

import ast
import importlib.util
import inspect
import re
import shlex
from pathlib import Path

import pytest
import typer.main

from tests.fakes.paths import REPO

DOCS = REPO / "docs"
AZURE_MD = DOCS / "guides" / "azure.md"
DOCKER_MD = DOCS / "guides" / "docker-pool.md"
DEPLOYMENTS_MD = DOCS / "guides" / "deployments.md"
CONCEPTS_MD = DOCS / "concepts" / "pools-and-images.md"
PAGES = (AZURE_MD, DOCKER_MD, DEPLOYMENTS_MD, CONCEPTS_MD)
GUIDES = (AZURE_MD, DOCKER_MD, DEPLOYMENTS_MD)
BICEP = (REPO / "infra" / "compute" / "azure" / "main.bicep").read_text()
CODE_BLOCK = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)


def text(page: Path) -> str:
    """The page with its whitespace runs joined to one space (a quoted line may wrap)."""
    return " ".join(page.read_text().split())


def code_lines(page: Path) -> list[str]:
    """Every line of the page's code blocks."""
    return [line.strip() for block in CODE_BLOCK.findall(page.read_text()) for line in block.splitlines()]


def deploy_outputs(prefix: str = "tflow") -> dict:
    """`az deployment` outputs of main.bicep, shaped as deploy.sh gets them (values as a deploy would make them)."""
    names = re.findall(r"^output (\w+) ", BICEP, re.M)
    values = {name: f"https://{prefix}{name.lower()}.example/" for name in names}
    values.update(
        container="trainflow",
        share="trainflow",
        workspace=f"{prefix}-ws",
        compute="trainflow-gpu",
        datastore="trainflow_files",
        blobDatastore="trainflow_blob",
        registry=f"{prefix}acrxyz.azurecr.io",
        nfsExport=f"{prefix}nfs.file.core.windows.net:/{prefix}nfs/fileserver",
        subnetId="/subscriptions/s/resourceGroups/trainflow/providers/Microsoft.Network/virtualNetworks/v/subnets/c",
        vmSize="Standard_NC24ads_A100_v4",
        maxNodes=2,
        lowPriority=False,
        gpusPerNode=1,
    )
    return {name: {"value": value} for name, value in values.items()}


def written_config_text() -> str:
    """The config deploy.sh prints, from infra/compute/azure/config_from_outputs.py."""
    path = REPO / "infra" / "compute" / "azure" / "config_from_outputs.py"
    spec = importlib.util.spec_from_file_location("config_from_outputs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.config(deploy_outputs(), "00000000-0000-0000-0000-000000000001", "trainflow")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The written config, loaded as a run loads it."""
    from flows.config import load_config

    path = tmp_path_factory.mktemp("azure") / "mine.yaml"
    path.write_text(written_config_text())
    return load_config(path, {}, environ={})


def needed_variables(cfg) -> set[str]:
    """The environment variables a run of `cfg` reads a secret from: storage, file share, registry password."""
    from infra.storage import credentials, fileshare

    variables = {**credentials.secret_settings(cfg.storage), **fileshare.secret_settings(cfg.fileshare)}.values()
    return set(variables) | ({cfg.image.password_env} if cfg.image.username else set())


def test_the_azure_guide_exports_exactly_the_variables_the_written_config_names(written):
    exported = {m.group(1) for line in code_lines(AZURE_MD) if (m := re.match(r"export (\w+)=", line))}
    assert exported == needed_variables(written) == {"AZURE_STORAGE_KEY", "REGISTRY_PASSWORD"}
    assert written.fileshare.auth == "key" and written.storage.auth == "default"


def test_the_missing_key_line_is_the_one_the_preflight_prints(written):
    from flows.preflight import check_variables
    from infra.storage.errors import MissingSecret

    with pytest.raises(MissingSecret) as refused:
        check_variables(written, {})
    quoted = re.search(r"`error: (environment variable AZURE_STORAGE_KEY [^`]*)`", text(AZURE_MD)).group(1)
    assert str(refused.value).startswith(quoted)


def test_the_expired_token_line_is_the_one_the_registry_check_prints_and_the_token_lasts_about_3_hours(written):
    from infra.compute.azureml.settings import ENTRA_TOKEN_USER, check_registry
    from infra.images.registry import registry_error

    assert written.image.username == ENTRA_TOKEN_USER
    quoted = re.search(r"`error: (registry <registry>\.azurecr\.io refused [^`]*)`", text(AZURE_MD)).group(1)
    error = registry_error("<registry>.azurecr.io", "unauthorized: authentication required", ENTRA_TOKEN_USER)
    assert str(error).startswith(quoted) and error.permanent
    assert "about 3 hours" in text(AZURE_MD) and "about 3 hours" in text(DEPLOYMENTS_MD)
    connection = written.pool.model_copy(update={"registry_access": "connection"})
    with pytest.raises(ValueError, match="about 3 h"):
        check_registry(connection, written.image)


def test_the_registry_has_no_admin_user_in_the_template_the_guide_and_azure_yaml():
    registry = BICEP[BICEP.index("resource registry ") :]
    assert "adminUserEnabled: false" in registry[: registry.index("\n}\n")]
    assert "The registry has no admin user." in text(AZURE_MD)
    example = (REPO / "flows" / "configs" / "azure.yaml").read_text()
    comments = " ".join(line.split("#", 1)[1] for line in example.splitlines() if "#" in line)
    mentions = re.findall(r"[^.;]*admin user[^.;]*", comments)
    assert mentions and all("no admin user" in mention for mention in mentions), mentions
    assert "REGISTRY_PASSWORD" in comments and "az acr token create" in comments


def test_the_template_grants_the_user_no_blob_role_so_the_guide_assigns_the_one_the_error_names():
    from infra.storage.credentials import missing_delegation_role

    principals = re.findall(r"principalId: (\w+)\.identity\.principalId", BICEP)
    assert principals and set(principals) <= {"cluster", "workspace"}
    role = "Storage Blob Data Contributor"
    assert f'az role assignment create --role "{role}"' in text(AZURE_MD)
    assert role in str(missing_delegation_role("https://a.blob.core.windows.net", Exception()))
    assert "ba92f5b4-2d11-453d-a403-e96b0029c9fe" in BICEP  # the built-in id of Storage Blob Data Contributor


def test_the_deploy_line_calls_deploy_sh_as_its_usage_says_with_parameters_of_the_template():
    script = (REPO / "infra" / "compute" / "azure" / "deploy.sh").read_text()
    assert 'echo "usage: $0 <resource group> <region> <prefix> [name=value ...]"' in script
    line = next(line for line in code_lines(AZURE_MD) if line.startswith("infra/compute/azure/deploy.sh "))
    words = shlex.split(line.split(">")[0])
    group, region, prefix, *parameters = words[1:]
    assert (group, region) == ("trainflow", "westeurope") and re.fullmatch(r"[a-z0-9]{3,11}", prefix)
    declared = set(re.findall(r"^param (\w+) ", BICEP, re.M))
    assert parameters and {p.split("=")[0] for p in parameters} <= declared
    for name in ("vmSize", "maxNodes", "lowPriority", "nfsShareGiB"):
        assert name in declared and f"`{name}`" in text(AZURE_MD)
    assert f"--workspace-name {prefix}-ws" in text(AZURE_MD) and "name: '${prefix}-ws'" in BICEP
    first = written_config_text().splitlines()[0]
    assert f"`{first}`" in text(AZURE_MD)


def test_the_guide_registers_every_provider_the_template_deploys_and_checks_azure_ml_s_own_quota():
    """An empty subscription has few resource providers registered; the guide registers each namespace of the
    template's resources (Microsoft.Authorization is registered in every subscription), and checks the quota of Azure
    ML compute (`az ml compute list-usage`), not the VMs' (`az vm list-usage`)."""
    deployed = set(re.findall(r"^resource \w+ '(Microsoft\.\w+)/", BICEP, re.M)) - {"Microsoft.Authorization"}
    loop = next(line for line in code_lines(AZURE_MD) if "az provider register" in line)
    registered = {f"Microsoft.{name}" for name in re.search(r"for p in ([\w ]+);", loop).group(1).split()}
    assert deployed and registered == deployed
    assert "az ml compute list-usage" in text(AZURE_MD) and "az vm list-usage" not in text(AZURE_MD)
    assert "az extension add --name ml" in text(AZURE_MD)  # list-usage and job stream are the ml extension's


def test_the_nfs_share_s_size_the_guide_gives_is_the_template_s():
    size = re.search(r"@minValue\((\d+)\)\nparam nfsShareGiB int = (\d+)", BICEP)
    assert size and f"(`nfsShareGiB`, {int(size.group(2)):,} GiB by default, {size.group(1)} at least)" in text(
        AZURE_MD
    )
    assert "sku: { name: 'Premium_LRS' }\n  kind: 'FileStorage'" in BICEP  # a premium share: billed as provisioned


def test_the_names_the_guides_give_are_the_codes():
    from infra.compute.azureml import specs
    from infra.compute.azureml.settings import AzureMLPoolConfig
    from infra.compute.docker_nodes import LABEL, ContainerNodes

    assert specs.attempt_name("<run id>", 1) == "trainflow-<run id>-train-1"
    assert specs.attempt_name("<run id>", 2, "sync") == "trainflow-<run id>-sync-2"
    assert AzureMLPoolConfig().experiment == "trainflow" and "experiment `trainflow`" in text(AZURE_MD)
    assert ContainerNodes(None, "<run id>").container(0) == "trainflow-<run id>-node0"
    assert f"label={LABEL}" in text(DOCKER_MD)
    backend = inspect.getsource(importlib.import_module("infra.compute.azureml"))
    for spec in ("compute", "environment", "sync job", "job", "later attempts"):
        assert f'"{spec}"' in backend and f"`{spec}`" in text(AZURE_MD)


def test_the_image_is_built_for_the_docker_and_azureml_pools_only():
    from infra.compute import BACKENDS

    assert {name for name, backend in BACKENDS.items() if backend.needs_image} == {"docker", "azureml"}
    assert "only the process pool skips it" in text(DOCKER_MD).lower()
    assert "The process pool skips it." in text(CONCEPTS_MD)


def test_the_ui_line_of_the_deployments_guide_is_what_trainflow_ui_prints():
    from cli import services

    source = inspect.getsource(services)
    call = next(
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "print" and node.args
        if isinstance(node.args[0], ast.JoinedStr) and "Prefect UI at" in ast.unparse(node.args[0])
    )
    printed = eval(compile(ast.Expression(call.args[0]), "ui", "eval"), {"port": 4200})
    assert printed in code_lines(DEPLOYMENTS_MD)


def test_a_server_that_does_not_answer_yet_is_refused_with_the_line_the_guide_quotes():
    from cli.services import check_prefect_api
    from infra.core.errors import BadInput

    with pytest.raises(BadInput) as refused:
        check_prefect_api("not a url")
    head, tail = re.search(
        r"`(PREFECT_API_URL is) …(, which does not answer as Prefect's API)`", text(DEPLOYMENTS_MD)
    ).groups()
    assert str(refused.value).startswith(f"{head} not a url{tail}")


def trainflow_lines(page: Path) -> list[str]:
    """The arguments of every `trainflow` command in the page's code blocks (shell lines and systemd ExecStart)."""
    found = []
    for line in code_lines(page):
        match = re.match(r"^(?:ExecStart=)?\S*?(?:^|/)trainflow (.*)$", line)
        if match:
            found.append(match.group(1))
    return found


@pytest.mark.parametrize("page", GUIDES, ids=lambda p: p.name)
def test_every_trainflow_line_of_the_guides_parses(page):
    import cli

    command = typer.main.get_command(cli.app)
    lines = trainflow_lines(page)
    assert lines
    for line in lines:
        name, *args = shlex.split(line)
        assert name in command.commands, line
        command.commands[name].make_context(name, args)  # a usage error raises


def headings(page: Path) -> set[str]:
    """The anchors of the page's headings, as mkdocs' toc makes them."""
    anchors = set()
    for title in re.findall(r"^#+ (.*)$", CODE_BLOCK.sub("", page.read_text()), re.M):
        slug = re.sub(r"[^\w\s-]", "", title.lower()).strip()
        anchors.add(re.sub(r"[\s]+", "-", slug))
    return anchors


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_between_these_pages_reach_their_anchors(page):
    for target, anchor in re.findall(r"\]\(([\w./-]+\.md)#([\w-]+)\)", page.read_text()):
        linked = (page.parent / target).resolve()
        if linked in {p.resolve() for p in PAGES}:
            assert anchor in headings(linked), f"{page.name} links to {target}#{anchor}"


WORDS = re.compile(
    r"this machine|the issue|the goal|\blent\b|session|throwaway|not committed|not adopted|measured on"
    r"|\b20\d\d-\d\d-\d\d\b|tests/|test_|\b[0-9a-f]{40}\b",
    re.I,
)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_pages_carry_no_dates_test_names_or_development_words(page):
    assert not WORDS.findall(page.read_text())
    if page in GUIDES:
        assert len(page.read_text().splitlines()) <= 150
