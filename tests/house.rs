//! The house rules of the library crates (`stagedoor-jobs`, `-macros`, `-redis`, `-sqlx`,
//! `-cli`, `-dashboard`: every `.rs` file under their `src/`), one `#[test]` each:
//!
//! - **Functions.** No function or method with a body (free, in an `impl` or a trait, nested;
//!   closures are part of the function that holds them) is longer than 80 lines, counted from
//!   its first line after its attributes and docs to its closing brace.
//! - **Files.** No file is longer than 600 lines (unit tests included: move them to a sibling
//!   `foo/tests.rs` when that is what it takes).
//! - **Import circles.** In each crate, module A depends on module B (each a file) when code in
//!   A names an item defined in B through a path: a `use` or a path in code starting with
//!   `crate::`, `super::`, `self::` or a child module's name (paths inside macro calls count,
//!   except inside `quote!`, whose paths belong to the generated code). A path to a name a
//!   module re-exports leads to the module that defines it. Structure is not a dependency: a
//!   parent's `mod child;`, and a `pub`/`pub(crate)` re-export of what a descendant defines.
//!   No two modules may reach each other through these edges.
//! - **`ARCHITECTURE.md`.** Every path it names exists, and every library file is named in it.
//!   A path is a backticked word made of path characters that ends in `.rs` or `/` or holds a
//!   `/` (`*` matches within a file name). It is looked up from the repository's root, then
//!   from the directories named before it in its block, nearest first: a block is a `##`
//!   section, a paragraph that starts with `**`, or a table row (a row sees its section's
//!   directories; a file named names its directory). A crate's name in backticks names its directory and its `src/`, and names
//!   its `src/lib.rs`.
//!
//! Every library module file is `foo.rs` (with its children in `foo/`), never `foo/mod.rs`.
//!
//! Today's known violations are listed in [`KNOWN_VIOLATIONS`]; an entry that no longer fails
//! is an error too, so the list only shrinks. It must end empty.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use syn::spanned::Spanned;
use syn::visit::Visit;

/// The crates whose `src/` these rules cover.
const CRATES: &[&str] = &[
    "stagedoor-jobs",
    "stagedoor-jobs-macros",
    "stagedoor-jobs-redis",
    "stagedoor-jobs-sqlx",
    "stagedoor-jobs-cli",
    "stagedoor-jobs-dashboard",
];

const MAX_FN_LINES: usize = 80;
const MAX_FILE_LINES: usize = 600;

/// Today's violations, each as the check prints its key: `fn <file> <name>`, `file <file>`,
/// `circle <crate> {<module>, ..}`, `unnamed <file>`, `missing <path>`. Remove an entry when
/// you fix it (the tests fail on an entry that no longer fails). Must end empty (issue 32).
const KNOWN_VIOLATIONS: &[&str] = &[];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every library `.rs` file, relative to the repository root, with `/` separators.
fn library_files() -> Vec<String> {
    let mut out = Vec::new();
    for krate in CRATES {
        walk(&root(), &root().join(krate).join("src"), &mut out);
    }
    out.sort();
    out
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            walk(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(rel(root, &path));
        }
    }
}

fn rel(root: &Path, path: &Path) -> String {
    let rel = path.strip_prefix(root).unwrap_or(path);
    rel.components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

fn read(file: &str) -> String {
    std::fs::read_to_string(root().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn parse(file: &str) -> syn::File {
    syn::parse_file(&read(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// Compares what a check found with its part of [`KNOWN_VIOLATIONS`]: panics listing the new
/// violations (with their details and the fix) and the stale entries.
fn judge(kind: &str, found: BTreeMap<String, String>, fix: &str) {
    let prefix = format!("{kind} ");
    let known: BTreeSet<&str> = KNOWN_VIOLATIONS
        .iter()
        .copied()
        .filter(|k| k.starts_with(&prefix))
        .collect();
    let mut report = String::new();
    for (key, detail) in &found {
        if !known.contains(key.as_str()) {
            let _ = writeln!(report, "{detail}");
        }
    }
    if !report.is_empty() {
        report = format!("{report}fix: {fix}\n");
    }
    for key in known {
        if !found.contains_key(key) {
            let _ = writeln!(
                report,
                "stale: KNOWN_VIOLATIONS lists {key:?}, which no longer fails: remove it"
            );
        }
    }
    // The whole listing, known entries included, for whoever runs with --nocapture.
    for (key, detail) in &found {
        println!("{detail}\n  (key {key:?})");
    }
    assert!(report.is_empty(), "\n{report}");
}

// ---------------------------------------------------------------------------------------------
// Functions and files

/// Collects the functions with a body in a file, nested ones included.
struct Functions {
    owner: Vec<String>,
    found: Vec<(String, usize, usize)>,
}

impl Functions {
    fn record(&mut self, name: &syn::Ident, first: proc_macro2::Span, block: &syn::Block) {
        let start = first.start().line;
        let end = block.brace_token.span.close().end().line;
        let name = match self.owner.last() {
            Some(owner) => format!("{owner}::{name}"),
            None => name.to_string(),
        };
        self.found.push((name, start, end + 1 - start));
    }
}

/// The span of an item's first token after its attributes.
fn first_token(vis: &syn::Visibility, sig: &syn::Signature) -> proc_macro2::Span {
    match vis {
        syn::Visibility::Inherited => sig.span(),
        _ => vis.span(),
    }
}

fn type_name(ty: &syn::Type) -> String {
    match ty {
        syn::Type::Path(p) => p
            .path
            .segments
            .last()
            .map_or_else(String::new, |s| s.ident.to_string()),
        _ => "_".to_owned(),
    }
}

impl<'ast> Visit<'ast> for Functions {
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.record(&f.sig.ident, first_token(&f.vis, &f.sig), &f.block);
        syn::visit::visit_item_fn(self, f);
    }
    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.record(&f.sig.ident, first_token(&f.vis, &f.sig), &f.block);
        syn::visit::visit_impl_item_fn(self, f);
    }
    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(block) = &f.default {
            self.record(&f.sig.ident, f.sig.span(), block);
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        self.owner.push(type_name(&i.self_ty));
        syn::visit::visit_item_impl(self, i);
        self.owner.pop();
    }
    fn visit_item_trait(&mut self, t: &'ast syn::ItemTrait) {
        self.owner.push(t.ident.to_string());
        syn::visit::visit_item_trait(self, t);
        self.owner.pop();
    }
}

#[test]
fn no_function_over_80_lines() {
    let mut found = BTreeMap::new();
    for file in library_files() {
        let mut functions = Functions {
            owner: Vec::new(),
            found: Vec::new(),
        };
        functions.visit_file(&parse(&file));
        for (name, line, len) in functions.found {
            if len > MAX_FN_LINES {
                found.insert(
                    format!("fn {file} {name}"),
                    format!("{file}:{line}: fn `{name}` is {len} lines (limit {MAX_FN_LINES})"),
                );
            }
        }
    }
    judge(
        "fn",
        found,
        "split it: name its steps as functions of their own, each at most 80 lines",
    );
}

#[test]
fn no_file_over_600_lines() {
    let mut found = BTreeMap::new();
    for file in library_files() {
        let len = read(&file).lines().count();
        if len > MAX_FILE_LINES {
            found.insert(
                format!("file {file}"),
                format!("{file}: {len} lines (limit {MAX_FILE_LINES})"),
            );
        }
    }
    judge(
        "file",
        found,
        "split it by concern (`foo.rs` + `foo/`), or move its unit tests to `foo/tests.rs`",
    );
}

// ---------------------------------------------------------------------------------------------
// Import circles

/// A module's path in its crate (`[]` is the crate root).
type ModPath = Vec<String>;

/// What the circle check knows of one file-module.
#[derive(Default)]
struct Module {
    file: String,
    /// Names of the items it defines (at its top level or in its inline modules' top level).
    defs: BTreeSet<String>,
    /// Names it re-exports (`pub use`, `pub(crate) use`), with the absolute path each leads to.
    reexports: HashMap<String, ModPath>,
    /// Absolute paths of its glob re-exports (`pub use x::*`).
    globs: Vec<ModPath>,
    /// Every path it names.
    refs: Vec<Ref>,
}

/// A path a module names.
struct Ref {
    /// Absolute, from the crate root.
    path: ModPath,
    line: usize,
    /// A `pub` or `pub(crate)` `use`.
    reexport: bool,
    /// Names a module itself (a glob's, a `self` in a `use` group).
    module: bool,
}

/// A file's module path from its place under `src/` (`a/mod.rs` and `a.rs` are both `a`).
fn mod_path(krate: &str, file: &str) -> Option<ModPath> {
    let inner = file.strip_prefix(&format!("{krate}/src/"))?;
    if inner == "main.rs" {
        return None; // the binary is a crate of its own
    }
    let inner = inner.strip_suffix(".rs")?;
    let mut parts: ModPath = inner.split('/').map(str::to_owned).collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    Some(parts)
}

/// Walks one file: its definitions, re-exports and the paths it names.
struct Refs<'a> {
    krate: &'a BTreeSet<ModPath>,
    /// The module the code being walked is in (the file's, then inline modules).
    here: ModPath,
    /// The file-module's own path.
    file_mod: ModPath,
    module: Module,
    in_fn: usize,
}

impl Refs<'_> {
    /// Turns a path as written into an absolute one, if it starts inside the crate.
    fn absolute(&self, segs: &[String]) -> Option<ModPath> {
        let first = segs.first()?;
        let mut base;
        let mut rest = segs;
        match first.as_str() {
            "crate" => {
                base = Vec::new();
                rest = &segs[1..];
            }
            "self" | "super" => {
                base = self.here.clone();
                while let Some(s) = rest.first() {
                    match s.as_str() {
                        "self" => {}
                        "super" => {
                            base.pop()?;
                        }
                        _ => break,
                    }
                    rest = &rest[1..];
                }
            }
            name => {
                let mut child = self.here.clone();
                child.push(name.to_owned());
                if segs.len() < 2 || !self.krate.contains(&child) {
                    return None;
                }
                base = self.here.clone();
            }
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    fn reference(&mut self, segs: &[String], line: usize) {
        if let Some(path) = self.absolute(segs) {
            let module = segs
                .last()
                .is_some_and(|s| ["crate", "self", "super"].contains(&s.as_str()));
            let (reexport, module) = (false, module);
            self.module.refs.push(Ref {
                path,
                line,
                reexport,
                module,
            });
        }
    }

    /// Each path of a `use` tree, as written (a group's `self` names the module itself).
    fn use_paths(
        tree: &syn::UseTree,
        prefix: &mut Vec<String>,
        out: &mut Vec<(Vec<String>, String, bool)>,
    ) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                Self::use_paths(&p.tree, prefix, out);
                prefix.pop();
            }
            syn::UseTree::Name(n) if n.ident == "self" => {
                let name = prefix.last().cloned().unwrap_or_default();
                out.push((prefix.clone(), name, true));
            }
            syn::UseTree::Name(n) => {
                let mut p = prefix.clone();
                p.push(n.ident.to_string());
                out.push((p, n.ident.to_string(), false));
            }
            syn::UseTree::Rename(r) => {
                let mut p = prefix.clone();
                p.push(r.ident.to_string());
                out.push((p, r.rename.to_string(), false));
            }
            syn::UseTree::Glob(_) => out.push((prefix.clone(), "*".to_owned(), true)),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    Self::use_paths(t, prefix, out);
                }
            }
        }
    }

    fn define(&mut self, name: &syn::Ident) {
        if self.in_fn == 0 {
            self.module.defs.insert(name.to_string());
        }
    }

    /// Paths in a macro's tokens: `crate`, `self` or `super` followed by `::`.
    fn macro_tokens(&mut self, tokens: proc_macro2::TokenStream) {
        use proc_macro2::TokenTree;
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < tokens.len() {
            match &tokens[i] {
                TokenTree::Group(g) => self.macro_tokens(g.stream()),
                TokenTree::Ident(id)
                    if ["crate", "self", "super"].contains(&id.to_string().as_str()) =>
                {
                    let line = id.span().start().line;
                    let mut segs = vec![id.to_string()];
                    let mut j = i + 1;
                    while let (
                        Some(TokenTree::Punct(a)),
                        Some(TokenTree::Punct(b)),
                        Some(TokenTree::Ident(n)),
                    ) = (tokens.get(j), tokens.get(j + 1), tokens.get(j + 2))
                    {
                        if a.as_char() != ':' || b.as_char() != ':' {
                            break;
                        }
                        segs.push(n.to_string());
                        j += 3;
                    }
                    if segs.len() > 1 {
                        self.reference(&segs, line);
                    }
                    i = j;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }
}

impl<'ast> Visit<'ast> for Refs<'_> {
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let mut paths = Vec::new();
        Self::use_paths(&u.tree, &mut Vec::new(), &mut paths);
        let public = !matches!(u.vis, syn::Visibility::Inherited);
        let line = u.span().start().line;
        for (segs, name, module) in paths {
            let Some(abs) = self.absolute(&segs) else {
                continue;
            };
            if public && self.in_fn == 0 && self.here == self.file_mod {
                if name == "*" {
                    self.module.globs.push(abs.clone());
                } else {
                    self.module.reexports.insert(name, abs.clone());
                }
            }
            self.module.refs.push(Ref {
                path: abs,
                line,
                reexport: public,
                module,
            });
        }
    }
    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if p.leading_colon.is_none() && segs.len() > 1 {
            self.reference(&segs, p.span().start().line);
        }
        syn::visit::visit_path(self, p);
    }
    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        let name = m.path.segments.last().map(|s| s.ident.to_string());
        if !matches!(
            name.as_deref(),
            Some("quote" | "quote_spanned" | "parse_quote")
        ) {
            self.macro_tokens(m.tokens.clone());
        }
        syn::visit::visit_macro(self, m);
    }
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if m.content.is_some() {
            self.here.push(m.ident.to_string());
            syn::visit::visit_item_mod(self, m);
            self.here.pop();
        }
    }
    fn visit_block(&mut self, b: &'ast syn::Block) {
        self.in_fn += 1;
        syn::visit::visit_block(self, b);
        self.in_fn -= 1;
    }
    fn visit_item_struct(&mut self, i: &'ast syn::ItemStruct) {
        self.define(&i.ident);
        syn::visit::visit_item_struct(self, i);
    }
    fn visit_item_enum(&mut self, i: &'ast syn::ItemEnum) {
        self.define(&i.ident);
        syn::visit::visit_item_enum(self, i);
    }
    fn visit_item_fn(&mut self, i: &'ast syn::ItemFn) {
        self.define(&i.sig.ident);
        syn::visit::visit_item_fn(self, i);
    }
    fn visit_item_trait(&mut self, i: &'ast syn::ItemTrait) {
        self.define(&i.ident);
        syn::visit::visit_item_trait(self, i);
    }
    fn visit_item_type(&mut self, i: &'ast syn::ItemType) {
        self.define(&i.ident);
        syn::visit::visit_item_type(self, i);
    }
    fn visit_item_const(&mut self, i: &'ast syn::ItemConst) {
        self.define(&i.ident);
        syn::visit::visit_item_const(self, i);
    }
    fn visit_item_static(&mut self, i: &'ast syn::ItemStatic) {
        self.define(&i.ident);
        syn::visit::visit_item_static(self, i);
    }
    fn visit_item_union(&mut self, i: &'ast syn::ItemUnion) {
        self.define(&i.ident);
        syn::visit::visit_item_union(self, i);
    }
    fn visit_item_macro(&mut self, i: &'ast syn::ItemMacro) {
        if let Some(name) = &i.ident {
            self.define(name);
        }
        syn::visit::visit_item_macro(self, i);
    }
}

/// The file-module that defines what `path` names: the longest file-module prefix, followed
/// through re-exports.
fn defining(
    modules: &BTreeMap<ModPath, Module>,
    path: &[String],
    module: bool,
    depth: usize,
) -> Option<ModPath> {
    let mut len = (0..=path.len())
        .rev()
        .find(|&n| modules.contains_key(&path[..n]))?;
    // `a::f` where `a` defines or re-exports an item `f` besides its module `f`: the item.
    if !module && len > 0 && len == path.len() {
        let parent = modules.get(&path[..len - 1]);
        let name = &path[len - 1];
        if parent.is_some_and(|m| m.defs.contains(name) || m.reexports.contains_key(name)) {
            len -= 1;
        }
    }
    let here = path[..len].to_vec();
    let (Some(name), Some(module)) = (path.get(len), modules.get(&here)) else {
        return Some(here);
    };
    if module.defs.contains(name) || depth > 8 {
        return Some(here);
    }
    if let Some(target) = module.reexports.get(name) {
        let mut next = target.clone();
        next.extend(path[len + 1..].iter().cloned());
        return defining(modules, &next, false, depth + 1);
    }
    for glob in &module.globs {
        let mut next = glob.clone();
        next.extend(path[len..].iter().cloned());
        if let Some(found) = defining(modules, &next, false, depth + 1)
            && modules.get(&found).is_some_and(|m| m.defs.contains(name))
        {
            return Some(found);
        }
    }
    Some(here)
}

fn modules_of(krate: &str, files: &[String]) -> BTreeMap<ModPath, Module> {
    let paths: BTreeMap<ModPath, &String> = files
        .iter()
        .filter_map(|f| mod_path(krate, f).map(|p| (p, f)))
        .collect();
    let known: BTreeSet<ModPath> = paths.keys().cloned().collect();
    let mut modules = BTreeMap::new();
    for (path, file) in paths {
        let mut refs = Refs {
            krate: &known,
            here: path.clone(),
            file_mod: path.clone(),
            module: Module {
                file: file.clone(),
                ..Module::default()
            },
            in_fn: 0,
        };
        refs.visit_file(&parse(file));
        modules.insert(path, refs.module);
    }
    modules
}

fn show(path: &ModPath) -> String {
    if path.is_empty() {
        "crate".to_owned()
    } else {
        path.join("::")
    }
}

/// Strongly connected components (Tarjan), each sorted.
fn components(
    edges: &BTreeMap<ModPath, BTreeMap<ModPath, usize>>,
    nodes: &[ModPath],
) -> Vec<Vec<ModPath>> {
    struct State<'a> {
        edges: &'a BTreeMap<ModPath, BTreeMap<ModPath, usize>>,
        index: HashMap<ModPath, usize>,
        low: HashMap<ModPath, usize>,
        stack: Vec<ModPath>,
        on: BTreeSet<ModPath>,
        out: Vec<Vec<ModPath>>,
    }
    fn visit(s: &mut State<'_>, v: &ModPath) {
        let i = s.index.len();
        s.index.insert(v.clone(), i);
        s.low.insert(v.clone(), i);
        s.stack.push(v.clone());
        s.on.insert(v.clone());
        let next: Vec<ModPath> = s
            .edges
            .get(v)
            .map(|e| e.keys().cloned().collect())
            .unwrap_or_default();
        for w in next {
            if !s.index.contains_key(&w) {
                visit(s, &w);
                let l = s.low[&w].min(s.low[v]);
                s.low.insert(v.clone(), l);
            } else if s.on.contains(&w) {
                let l = s.index[&w].min(s.low[v]);
                s.low.insert(v.clone(), l);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(&w);
                let done = &w == v;
                comp.push(w);
                if done {
                    break;
                }
            }
            comp.sort();
            s.out.push(comp);
        }
    }
    let mut s = State {
        edges,
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for n in nodes {
        if !s.index.contains_key(n) {
            visit(&mut s, n);
        }
    }
    s.out
}

#[test]
fn no_import_circle() {
    let files = library_files();
    let mut found = BTreeMap::new();
    for krate in CRATES {
        let modules = modules_of(krate, &files);
        // edges[a][b] = the line of a's first path into b.
        let mut edges: BTreeMap<ModPath, BTreeMap<ModPath, usize>> = BTreeMap::new();
        for (from, module) in &modules {
            for r in &module.refs {
                let Some(to) = defining(&modules, &r.path, r.module, 0) else {
                    continue;
                };
                let (line, structure) = (&r.line, r.reexport && to.starts_with(from));
                if &to == from || structure {
                    continue;
                }
                let first = edges
                    .entry(from.clone())
                    .or_default()
                    .entry(to)
                    .or_insert(*line);
                *first = (*first).min(*line);
            }
        }
        let nodes: Vec<ModPath> = modules.keys().cloned().collect();
        for comp in components(&edges, &nodes) {
            if comp.len() < 2 {
                continue;
            }
            let names: Vec<String> = comp.iter().map(show).collect();
            let key = format!("circle {krate} {{{}}}", names.join(", "));
            let mut detail = format!("{krate}: import circle between {}:\n", names.join(", "));
            for from in &comp {
                let file = &modules[from].file;
                let text = read(file);
                for (to, line) in edges.get(from).into_iter().flatten() {
                    if comp.contains(to) {
                        let src = text.lines().nth(line - 1).unwrap_or("").trim();
                        let _ = writeln!(
                            detail,
                            "  {file}:{line}: {} -> {}: {src}",
                            show(from),
                            show(to)
                        );
                    }
                }
            }
            found.insert(key, detail);
        }
    }
    judge(
        "circle",
        found,
        "break each circle: move what both sides use to a module that imports neither, \
         or pass it in instead of reaching back up",
    );
}

// ---------------------------------------------------------------------------------------------
// ARCHITECTURE.md

/// A backticked word that names a path.
fn as_path(word: &str) -> Option<&str> {
    let pathlike = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./*".contains(c));
    let named = word.ends_with(".rs") || word.ends_with('/') || word.contains('/');
    (pathlike && named).then_some(word)
}

/// The files and directories `word` names from `base` (a `*` matches within a file name).
fn lookup(base: &Path, word: &str) -> Vec<PathBuf> {
    let path = base.join(word.trim_end_matches('/'));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let Some((head, tail)) = name.split_once('*') else {
        return if path.exists() {
            vec![path]
        } else {
            Vec::new()
        };
    };
    let Some(dir) = path.parent() else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            let n = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            n.len() >= head.len() + tail.len() && n.starts_with(head) && n.ends_with(tail)
        })
        .collect()
}

/// Walks `ARCHITECTURE.md`: what it names that does not exist, and the files it names.
fn architecture() -> (BTreeMap<String, String>, BTreeSet<String>) {
    let root = root();
    let mut missing = BTreeMap::new();
    let mut named = BTreeSet::new();
    let mut section: Vec<PathBuf> = Vec::new();
    for (n, line) in read("ARCHITECTURE.md").lines().enumerate() {
        if line.starts_with("## ") || line.starts_with("**") {
            section.clear();
        }
        let row = line.starts_with('|');
        let mut bases = section.clone();
        for (i, word) in line.split('`').enumerate() {
            if i % 2 == 0 {
                continue;
            }
            let dirs = if row { &mut bases } else { &mut section };
            if CRATES.contains(&word) {
                dirs.push(root.join(word));
                dirs.push(root.join(word).join("src"));
                named.insert(format!("{word}/src/lib.rs"));
                continue;
            }
            let Some(word) = as_path(word) else {
                continue;
            };
            let seen: Vec<PathBuf> = std::iter::once(root.clone())
                .chain(dirs.iter().rev().cloned())
                .collect();
            let hits = seen.iter().map(|b| lookup(b, word)).find(|h| !h.is_empty());
            let Some(hits) = hits else {
                missing.insert(
                    format!("missing {word}"),
                    format!(
                        "ARCHITECTURE.md:{}: `{word}` names no file or directory",
                        n + 1
                    ),
                );
                continue;
            };
            for hit in hits {
                if hit.is_dir() {
                    dirs.push(hit);
                } else {
                    named.insert(rel(&root, &hit));
                    dirs.extend(hit.parent().map(Path::to_path_buf));
                }
            }
        }
    }
    (missing, named)
}

#[test]
fn architecture_names_what_exists() {
    let (missing, _) = architecture();
    judge(
        "missing",
        missing,
        "correct the path in ARCHITECTURE.md (it is looked up from the root, then from the \
         directories its block named before it)",
    );
}

#[test]
fn architecture_names_every_library_file() {
    let (_, named) = architecture();
    let mut found = BTreeMap::new();
    for file in library_files() {
        if !named.contains(&file) {
            found.insert(
                format!("unnamed {file}"),
                format!("{file}: not named in ARCHITECTURE.md"),
            );
        }
    }
    judge(
        "unnamed",
        found,
        "name it in ARCHITECTURE.md, in its crate's table (what the file holds, one row)",
    );
}

#[test]
fn module_files_in_one_style() {
    let found: BTreeMap<String, String> = library_files()
        .into_iter()
        .filter(|f| f.ends_with("/mod.rs"))
        .map(|f| (format!("modrs {f}"), format!("{f}: a `mod.rs` module file")))
        .collect();
    judge(
        "modrs",
        found,
        "name it after its module (`foo/mod.rs` -> `foo.rs`, children stay in `foo/`), the project's one style",
    );
}
