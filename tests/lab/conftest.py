"""Lab-test hygiene: every module must leave no run behind (its fabrics stopped, its killed runs
cleaned). A module that does is reported here, by name, and its leftovers are cleaned so that the
next module starts from nothing (a leftover run once made another module's test misread its state).
Runs that were there before the module began are not its own: a lab the developer started by
hand (a guest machine, a prompt) is left alone."""

import os

import pytest


@pytest.fixture(scope="module", autouse=True)
def leaves_no_run_behind(request):
    from fabriclab.lab.runstate import RunState

    before = {run.id for run in RunState.all()} if os.geteuid() == 0 else set()
    # Autouse fixtures are set up first, so this one is torn down after the module's own fixtures.
    yield
    if os.geteuid() != 0:
        return
    from fabriclab.lab.clean import clean, remove_run

    left = [run for run in RunState.all() if run.id not in before]
    if left:
        names = [(run.id, "live" if run.live else "dead") for run in left]
        for run in left:
            remove_run(run)
        clean()                     # what a killed run of the module left beyond its record
        pytest.fail(f"{request.module.__name__} left runs behind: {names}", pytrace=False)


class QuickCatalogue:
    """One `fabriclab reproduce --quick` run, shared by the session: the catalogue and the results
    folder of every draw of every experiment a claim reads, so the experiment tests check those
    folders (their mechanisms, on every draw) instead of running the same quick experiments a
    second time. The comparisons between runs are the claims' to judge, over the draws."""

    def __init__(self, folder, exit_code):
        self.folder, self.exit_code = folder, exit_code

    def data(self):
        import json

        return json.loads((self.folder / "catalogue.json").read_text())

    def draws(self, name):
        return self.data()["experiments"][name]["draws"]

    def folder_of(self, name, k=1):
        from fabriclab.workflows.reproduce.catalogue import draw_folder

        return self.folder / draw_folder(name, k)

    def doc(self, name, k=1):
        """Draw k's results document of the experiment; the test fails with the catalogue's reason
        if the experiment failed."""
        from fabriclab.results import document

        error = self.data()["experiments"][name]["error"]
        if error:
            pytest.fail(f"experiment {name} failed in reproduce --quick: {error}", pytrace=False)
        return document.load(self.folder_of(name, k))

    def docs(self, name):
        """[(k, draw k's document)] for every draw of the experiment."""
        return [(k, self.doc(name, k)) for k in range(1, self.draws(name) + 1)]


@pytest.fixture(scope="session")
def quick_catalogue(tmp_path_factory):
    """The catalogue, run as a user runs `fabriclab reproduce --quick`: a process of its own, whose
    experiment draws (two of each) leave nothing in the test process (its output: reproduce-quick.log
    beside the folder). FABRICLAB_QUICK_CATALOGUE=FOLDER reads a catalogue run before instead (a
    CI run's, say): the tests' figures over many catalogues, without running one each time."""
    import pathlib
    import subprocess
    import sys

    given = os.environ.get("FABRICLAB_QUICK_CATALOGUE")
    if given:
        folder = pathlib.Path(given)
        if not (folder / "catalogue.json").is_file():
            pytest.exit(f"FABRICLAB_QUICK_CATALOGUE: no catalogue.json in {str(folder)[:200]}", returncode=4)
        return QuickCatalogue(folder, 0)
    folder = tmp_path_factory.mktemp("reproduce-quick")
    proc = subprocess.run([sys.executable, "-m", "fabriclab.cli.main", "reproduce", "--quick", "--out", str(folder)],
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    (folder.parent / "reproduce-quick.log").write_text(proc.stdout)
    return QuickCatalogue(folder, proc.returncode)
