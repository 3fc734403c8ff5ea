"""The layout's rule, checked on the sources: imports run one way, so no set of files
of the library or its connectors imports itself round in a circle of more than three
files (scripts/imports.py draws the file-level imports); and the drawing itself finds
such a circle where there is one."""

import subprocess
import sys

from conftest import ROOT

IMPORTS = ROOT / "scripts" / "imports.py"


def draw(*roots):
    return subprocess.run([sys.executable, str(IMPORTS), *map(str, roots)],
                          capture_output=True, text=True)


def test_no_circle_of_more_than_three_files_in_the_library_or_its_connectors():
    done = draw(ROOT / "crates" / "sessionizer" / "src", ROOT / "crates" / "connectors" / "src")
    assert done.returncode == 0, done.stdout + done.stderr


def write(root, files):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_drawing_finds_a_circle_of_four_files_through_facades_and_groups(tmp_path):
    # a -> b (a grouped import through the root's re-export), b -> c::d (super of a
    # module file), c::d -> e (a use of crate:: in code), e -> a: four files. The
    # comment and the test module's import count for nothing.
    write(tmp_path, {
        "lib.rs": "mod a;\nmod b;\nmod c;\nmod e;\npub use b::Thing;\n",
        "a.rs": "use crate::{Thing, e::Other as _};\n// use crate::c::d::D;\n",
        "b.rs": "pub struct Thing;\nfn f() { let _ = crate::c::d::make(); }\n",
        "c/mod.rs": "pub mod d;\n",
        "c/d.rs": "pub fn make() -> crate::e::Other { crate::e::Other }\n",
        "e.rs": "pub struct Other;\nuse super::a;\n#[cfg(test)]\nmod tests {\n    use crate::b::Thing;\n}\n",
    })
    done = draw(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "4 files: a, b, c::d, e" in done.stdout, done.stdout
    # Three files in a circle are within the rule.
    (tmp_path / "e.rs").write_text("pub struct Other;\n")
    (tmp_path / "c" / "d.rs").write_text("pub fn make() { let _ = crate::a::f; }\n")
    (tmp_path / "a.rs").write_text("use crate::Thing;\npub fn f() {}\n")
    done = draw(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 files: a, b, c::d" in done.stdout, done.stdout
