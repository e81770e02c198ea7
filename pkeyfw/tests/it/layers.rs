//! The code reads bottom-up: no circle of imports among pkeyfw-common's
//! modules (the ABI beneath the rules), nor among pkeyfw's commands; pkeyfw's
//! modules stand on floors ([`FLOORS`]) and no import runs up one; no command
//! imports another's internals; the lab sits on the product and nothing of
//! the product but its command imports it.
//!
//! Read from the sources, not from rustc: every path a module names that
//! starts at `crate`, `super`, `self` or a child module (in `use` trees and in
//! code alike), resolved through the modules' files and the crate root's
//! re-exports and exported macros, is an edge from the naming module to the
//! module the path ends in. A circle is reported with the file and line of
//! each of its edges.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

/// A module's path below its crate root (`["cmd", "attach"]`).
type ModPath = Vec<String>;

/// Called with the module a path is in, the path, its line, and whether
/// it is re-exported (`pub use`).
type PathVisitor<'a> = dyn FnMut(&[String], &[String], usize, bool) + 'a;

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Ident(String),
    /// `::`
    Sep,
    Punct(char),
}

/// The tokens of a Rust source with their lines; comments, strings and
/// character literals left out.
fn tokens(src: &str) -> Vec<(Token, usize)> {
    let s: Vec<char> = src.chars().collect();
    let (mut out, mut i, mut line) = (Vec::new(), 0, 1);
    let at = |i: usize| s.get(i).copied().unwrap_or('\0');
    while i < s.len() {
        let c = s[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < s.len() && s[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            loop {
                if at(i) == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if at(i) == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(at(i) == '\n');
                    i += 1;
                }
            }
        } else if c == '"'
            || (c == 'r' && matches!(at(i + 1), '"' | '#'))
            || (c == 'b' && at(i + 1) == '"')
        {
            // A string: raw ones end at a quote followed by as many #s.
            let raw = c == 'r';
            i += usize::from(c != '"');
            let mut hashes = 0;
            while raw && at(i) == '#' {
                hashes += 1;
                i += 1;
            }
            i += 1;
            loop {
                match at(i) {
                    '\\' if !raw => i += 2,
                    '"' if (1..=hashes).all(|h| at(i + h) == '#') => break,
                    '\0' => break,
                    ch => {
                        line += usize::from(ch == '\n');
                        i += 1;
                    }
                }
            }
            i += 1 + hashes;
        } else if c == '\'' {
            // A character literal, or a lifetime (only its quote skipped).
            if at(i + 1) == '\\' {
                i += 2;
                while at(i) != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                i += 1;
            }
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while at(i).is_alphanumeric() || at(i) == '_' {
                i += 1;
            }
            out.push((Token::Ident(s[start..i].iter().collect()), line));
        } else if c == ':' && at(i + 1) == ':' {
            out.push((Token::Sep, line));
            i += 2;
        } else {
            out.push((Token::Punct(c), line));
            i += 1;
        }
    }
    out
}

/// The paths of a use tree or a path expression starting at `toks[i]`:
/// `a::b::{c, d::e}` gives `a::b::c` and `a::b::d::e`; the index past it.
fn paths(toks: &[(Token, usize)], mut i: usize, prefix: &[String]) -> (Vec<ModPath>, usize) {
    let mut path = prefix.to_vec();
    loop {
        match &toks.get(i).map(|t| &t.0) {
            Some(Token::Ident(name)) => path.push(name.clone()),
            Some(Token::Punct('{')) => {
                let mut all = Vec::new();
                i += 1;
                while i < toks.len() && toks[i].0 != Token::Punct('}') {
                    let (found, next) = paths(toks, i, &path);
                    all.extend(found);
                    i = next;
                    // Skip `as alias` and the like up to the next branch.
                    let mut depth = 0;
                    while i < toks.len() {
                        match toks[i].0 {
                            Token::Punct('{') => depth += 1,
                            Token::Punct('}') if depth == 0 => break,
                            Token::Punct('}') => depth -= 1,
                            Token::Punct(',') if depth == 0 => {
                                i += 1;
                                break;
                            }
                            _ => {}
                        }
                        i += 1;
                    }
                }
                return (all, i + 1);
            }
            _ => return (vec![path], i),
        }
        i += 1;
        if toks.get(i).map(|t| &t.0) != Some(&Token::Sep) {
            return (vec![path], i);
        }
        i += 1;
    }
}

/// One crate's source: its modules' files.
struct Crate {
    /// Every module with a file, and the file.
    files: BTreeMap<ModPath, PathBuf>,
}

/// The module a path names from `here`: as far as it goes through modules,
/// and through a re-export (`pub use x::Name`) or an exported macro at the
/// end; None for a path outside the crate.
fn resolve(
    modules: &BTreeSet<ModPath>,
    reexports: &BTreeMap<(ModPath, String), ModPath>,
    here: &[String],
    path: &[String],
) -> Option<ModPath> {
    let (mut at, rest): (ModPath, &[String]) = match path.first().map(String::as_str) {
        Some("crate") => (Vec::new(), &path[1..]),
        Some("self") => (here.to_vec(), &path[1..]),
        Some("super") => {
            let mut at = here.to_vec();
            let mut rest = path;
            while rest.first().map(String::as_str) == Some("super") {
                at.pop();
                rest = &rest[1..];
            }
            (at, rest)
        }
        Some(child) if modules.contains(&[here, &[child.to_string()]].concat()) => {
            (here.to_vec(), path)
        }
        _ => return None,
    };
    for seg in rest {
        let child = [at.as_slice(), std::slice::from_ref(seg)].concat();
        if modules.contains(&child) {
            at = child;
        } else if let Some(to) = reexports.get(&(at.clone(), seg.clone())) {
            return Some(to.clone());
        } else {
            break;
        }
    }
    Some(at)
}

impl Crate {
    fn read(src: &Path) -> Crate {
        let mut files = BTreeMap::new();
        let mut dirs = vec![src.to_path_buf()];
        while let Some(dir) = dirs.pop() {
            for entry in fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                    continue;
                }
                if path.extension().is_none_or(|e| e != "rs") {
                    continue;
                }
                let rel = path.strip_prefix(src).unwrap().with_extension("");
                let mut module: ModPath = rel
                    .iter()
                    .map(|c| c.to_string_lossy().into_owned())
                    .collect();
                if matches!(module.last().map(String::as_str), Some("mod" | "lib")) {
                    module.pop();
                }
                // The binary's root is a crate of its own.
                if module != ["main"] {
                    files.insert(module, path);
                }
            }
        }
        Crate { files }
    }

    /// The crate's imports: each module with a file, the modules it names,
    /// and where (file:line).
    fn imports(&self) -> Vec<(ModPath, ModPath, String)> {
        let toks: BTreeMap<&ModPath, Vec<(Token, usize)>> = self
            .files
            .iter()
            .map(|(m, f)| (m, tokens(&fs::read_to_string(f).unwrap())))
            .collect();
        // Inline modules (`mod tests { .. }`) are modules too, for `super`.
        let mut modules: BTreeSet<ModPath> = self.files.keys().cloned().collect();
        let mut reexports = BTreeMap::new();
        for (module, toks) in &toks {
            for_each_path(module, toks, &mut |here, path, _, public| {
                if here.len() > module.len() {
                    modules.insert(here.to_vec());
                }
                if public && let Some(name) = path.last() {
                    let _ = reexports.insert((here.to_vec(), name.clone()), path.to_vec());
                }
            });
            for w in toks.windows(6) {
                if w[1].0 == Token::Ident("macro_export".into())
                    && w[3].0 == Token::Ident("macro_rules".into())
                    && let Token::Ident(name) = &w[5].0
                {
                    reexports.insert((Vec::new(), name.clone()), (*module).clone());
                }
            }
        }
        // Re-exports name items; resolve them to the module they are in.
        let reexports: BTreeMap<_, _> = reexports
            .iter()
            .filter_map(|((at, name), path)| {
                let to = resolve(&modules, &BTreeMap::new(), at, path)?;
                Some(((at.clone(), name.clone()), to))
            })
            .collect();
        let mut edges = Vec::new();
        for (module, toks) in &toks {
            let file = &self.files[*module];
            let file = file
                .strip_prefix(workspace())
                .unwrap_or(file)
                .display()
                .to_string();
            for_each_path(module, toks, &mut |here, path, line, _| {
                if let Some(mut to) = resolve(&modules, &reexports, here, path) {
                    while !self.files.contains_key(&to) {
                        to.pop();
                    }
                    edges.push(((*module).clone(), to, format!("{file}:{line}")));
                }
            });
        }
        edges
    }
}

/// Calls `f(module, path, line, in a pub use)` for every path in
/// a file of `module` that starts at `crate`, `super`, `self` or any name
/// (`resolve` keeps those naming a child module).
fn for_each_path(module: &[String], toks: &[(Token, usize)], f: &mut PathVisitor) {
    let mut here = module.to_vec();
    // Brace depth at which each inline module opened.
    let (mut depth, mut opened) = (0usize, Vec::new());
    let mut i = 0;
    while i < toks.len() {
        let prev = i.checked_sub(1).map(|p| &toks[p].0);
        match &toks[i].0 {
            Token::Punct('{') => depth += 1,
            Token::Punct('}') => {
                depth -= 1;
                if opened.last() == Some(&depth) {
                    opened.pop();
                    here.pop();
                }
            }
            Token::Ident(kw) if kw == "mod" => {
                if let (Some((Token::Ident(name), _)), Some((Token::Punct('{'), _))) =
                    (toks.get(i + 1), toks.get(i + 2))
                {
                    here.push(name.clone());
                    opened.push(depth);
                    depth += 1;
                    i += 3;
                    continue;
                }
            }
            Token::Ident(kw) if kw == "use" => {
                // `pub use`, `pub(crate) use`: a re-export.
                let public = matches!(prev, Some(Token::Punct(')')))
                    || matches!(prev, Some(Token::Ident(p)) if p == "pub");
                let (found, next) = paths(toks, i + 1, &[]);
                for path in found {
                    f(&here, &path, toks[i].1, public);
                }
                i = next;
                continue;
            }
            // `$crate`, and paths not inside another (`::` or `.` before).
            Token::Ident(_)
                if !matches!(prev, Some(Token::Sep | Token::Punct('.')))
                    && toks.get(i + 1).map(|t| &t.0) == Some(&Token::Sep) =>
            {
                let (found, next) = paths(toks, i, &[]);
                for path in found {
                    f(&here, &path, toks[i].1, false);
                }
                i = next;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
}

/// The circles of a graph (its strongly connected components of more than
/// one node), each with one edge per node and where it is.
fn circles(edges: &BTreeMap<(String, String), String>) -> Vec<Vec<String>> {
    let nodes: BTreeSet<&String> = edges.keys().flat_map(|(a, b)| [a, b]).collect();
    let reach = |from: &String| {
        let mut seen = BTreeSet::from([from.clone()]);
        let mut todo = vec![from.clone()];
        while let Some(n) = todo.pop() {
            for (a, b) in edges.keys() {
                if *a == n && seen.insert(b.clone()) {
                    todo.push(b.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        nodes.iter().map(|n| (*n, reach(n))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for n in &nodes {
        if done.contains(*n) {
            continue;
        }
        let component: BTreeSet<&String> = nodes
            .iter()
            .copied()
            .filter(|m| reaches[n].contains(*m) && reaches[m].contains(*n))
            .collect();
        done.extend(component.iter().map(|m| (*m).clone()));
        if component.len() > 1 {
            out.push(
                edges
                    .iter()
                    .filter(|((a, b), _)| component.contains(a) && component.contains(b))
                    .map(|((a, b), at)| format!("{a} -> {b} ({at})"))
                    .collect(),
            );
        }
    }
    out
}

/// The imports between the units `unit` makes of modules (None: leave the
/// module out), self-imports left out: the first place of each.
fn graph(
    krate: &Crate,
    unit: impl Fn(&ModPath) -> Option<String>,
) -> BTreeMap<(String, String), String> {
    let mut edges = BTreeMap::new();
    for (from, to, at) in krate.imports() {
        if let (Some(a), Some(b)) = (unit(&from), unit(&to))
            && a != b
        {
            edges.entry((a, b)).or_insert(at);
        }
    }
    edges
}

fn assert_no_circle(what: &str, edges: BTreeMap<(String, String), String>) {
    assert!(
        !edges.is_empty(),
        "{what}: no imports found; the reader is broken"
    );
    let found = circles(&edges);
    assert!(
        found.is_empty(),
        "{what} import each other:\n{}",
        found
            .iter()
            .map(|c| c.join("\n"))
            .collect::<Vec<_>>()
            .join("\n\n")
    );
}

/// The workspace, which the circles' places are named from.
fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

fn src(krate: &str) -> PathBuf {
    workspace().join(krate).join("src")
}

/// The reader finds a circle through a `use` tree, a re-export at the
/// crate root and a path in code, and none where there is none.
#[test]
fn a_circle_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| fs::write(dir.path().join(name), text).unwrap();
    write("lib.rs", "mod a;\nmod b;\nmod c;\npub use b::B;\n");
    write("a.rs", "use crate::{c::C, B as Bee};\npub struct A;\n");
    write("b.rs", "// crate::c::C\npub struct B;\n");
    write("c.rs", "pub struct C;\n");
    let krate = Crate::read(dir.path());
    let all = |m: &ModPath| Some(m.join("::"));
    assert!(circles(&graph(&krate, all)).is_empty());
    write("b.rs", "pub struct B(super::a::A);\n");
    let krate = Crate::read(dir.path());
    let found = circles(&graph(&krate, all));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0][0].starts_with("a -> b (") && found[0][1].starts_with("b -> a ("),
        "{found:?}"
    );
}

/// Each module of pkeyfw-common (`abi` beneath the rules).
#[test]
fn pkeyfw_common_has_no_circle() {
    let krate = Crate::read(&src("pkeyfw-common"));
    assert_no_circle(
        "pkeyfw-common's modules",
        graph(&krate, |m| Some(m.join("::"))),
    );
}

/// Each command with its submodules; `cmd` itself (shared arguments) is
/// beneath them.
#[test]
fn the_commands_have_no_circle() {
    let krate = Crate::read(&src("pkeyfw"));
    assert_no_circle(
        "pkeyfw's commands",
        graph(&krate, |m| {
            (m.first()? == "cmd").then(|| m[..m.len().min(2)].join("::"))
        }),
    );
}

/// The lab (test equipment behind the `lab` feature) is imported by its
/// command only, and imports no command.
#[test]
fn the_lab_is_on_top() {
    let krate = Crate::read(&src("pkeyfw"));
    let lab = |m: &ModPath| m.first().is_some_and(|f| f == "lab");
    let command = |m: &ModPath| m.first().is_some_and(|f| f == "cmd");
    let wrong: Vec<String> = krate
        .imports()
        .into_iter()
        .filter(|(from, to, _)| {
            (lab(to) && !lab(from) && *from != ["cmd", "lab"]) || (lab(from) && command(to))
        })
        .map(|(from, to, at)| format!("{} -> {} ({at})", from.join("::"), to.join("::")))
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert!(
        krate
            .imports()
            .iter()
            .any(|(from, to, _)| *from == ["cmd", "lab"] && lab(to)),
        "the lab's command does not call it; the reader is broken"
    );
}

/// Each module of pkeyfw's library layers (`host`, `loading`, `policy`,
/// `control`, `reporting`, `attachment`) with its submodules: the object's
/// programs beneath the filter and its pins, a policy file's reading context
/// beneath the file's and the rules' parsers. A layer's own module (`policy`, its
/// types) and its children import each other, as Rust's modules do.
#[test]
fn the_library_layers_have_no_circle() {
    let krate = Crate::read(&src("pkeyfw"));
    let layers = [
        "host",
        "loading",
        "policy",
        "control",
        "reporting",
        "attachment",
    ];
    let mut edges = graph(&krate, |m| {
        layers
            .contains(&m.first()?.as_str())
            .then(|| m[..m.len().min(2)].join("::"))
    });
    edges.retain(|(a, b), _| {
        let parent =
            |child: &str, of: &str| child.strip_prefix(of).is_some_and(|r| r.starts_with("::"));
        !parent(a, b) && !parent(b, a)
    });
    assert_no_circle("pkeyfw's library modules", edges);
}

/// pkeyfw's top-level modules, bottom-up (as lib.rs's doc lists them): a
/// module imports those on the floors beneath it and none beside it.
const FLOORS: &[&[&str]] = &[
    &["host"],
    &["policy", "capture"],
    &["loading"],
    &["reporting"],
    &["control"],
    &["attachment", "lab"],
    &["cni"],
    &["cmd"],
    &["cli"],
];

/// The imports that break the floors: one that runs up a floor, or beside
/// it to another module of its floor, or names a module on no floor.
fn up_a_floor(krate: &Crate) -> Vec<String> {
    let floor = |m: &ModPath| {
        let top = m.first()?;
        FLOORS.iter().position(|f| f.contains(&top.as_str()))
    };
    let mut wrong = BTreeSet::new();
    for (from, to, at) in krate.imports() {
        if from.is_empty() || to.is_empty() || from[0] == to[0] {
            continue;
        }
        let edge = format!("{at}: {} -> {}", from.join("::"), to.join("::"));
        match (floor(&from), floor(&to)) {
            (Some(a), Some(b)) if a > b => {}
            (Some(_), Some(_)) => {
                wrong.insert(edge);
            }
            _ => {
                wrong.insert(format!("{edge} (a module on no floor)"));
            }
        }
    }
    wrong.into_iter().collect()
}

/// The imports by which one command (`cmd::X` and its submodules) names
/// another's items: what several share is `cmd`'s own, or beneath it.
fn command_to_command(krate: &Crate) -> Vec<String> {
    let command = |m: &ModPath| (m.len() > 1 && m[0] == "cmd").then(|| m[1].clone());
    let mut wrong = BTreeSet::new();
    for (from, to, at) in krate.imports() {
        if let (Some(a), Some(b)) = (command(&from), command(&to))
            && a != b
        {
            wrong.insert(format!("{at}: {} -> {}", from.join("::"), to.join("::")));
        }
    }
    wrong.into_iter().collect()
}

/// The reader finds an import up a floor, one sideways, one from a command
/// into another, and none where there is none.
#[test]
fn a_wrong_floor_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| fs::write(dir.path().join(name), text).unwrap();
    fs::create_dir(dir.path().join("cmd")).unwrap();
    write("lib.rs", "mod host;\nmod policy;\nmod capture;\nmod cmd;\n");
    write("host.rs", "pub fn f() {}\n");
    write("policy.rs", "use crate::host::f;\n");
    write("capture.rs", "");
    write("cmd/mod.rs", "pub mod a;\npub mod b;\npub struct Shared;\n");
    write("cmd/a.rs", "use super::Shared;\npub struct A;\n");
    write("cmd/b.rs", "use crate::{cmd::Shared, policy};\n");
    let krate = Crate::read(dir.path());
    assert_eq!(up_a_floor(&krate), Vec::<String>::new());
    assert_eq!(command_to_command(&krate), Vec::<String>::new());
    write("host.rs", "pub fn f() { crate::policy::g() }\n");
    write("capture.rs", "use crate::policy;\n");
    write("cmd/b.rs", "use crate::cmd::a::A;\n");
    let krate = Crate::read(dir.path());
    let found = up_a_floor(&krate);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].ends_with(":1: capture -> policy"), "{found:?}");
    assert!(found[1].ends_with(":1: host -> policy"), "{found:?}");
    let found = command_to_command(&krate);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].ends_with(":1: cmd::b -> cmd::a"), "{found:?}");
}

/// No import runs from a floor to one above it, nor sideways.
#[test]
fn no_import_runs_up_a_floor() {
    let krate = Crate::read(&src("pkeyfw"));
    assert!(!krate.imports().is_empty(), "the reader is broken");
    let wrong = up_a_floor(&krate);
    assert!(
        wrong.is_empty(),
        "imports up a floor ({FLOORS:?}):\n{}",
        wrong.join("\n")
    );
}

/// No command imports another's internals (`cmd/mod.rs` promises it).
#[test]
fn no_command_imports_another() {
    let krate = Crate::read(&src("pkeyfw"));
    let wrong = command_to_command(&krate);
    assert!(
        wrong.is_empty(),
        "commands importing another's items:\n{}",
        wrong.join("\n")
    );
}
