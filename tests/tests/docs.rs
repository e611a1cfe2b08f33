//! The repository's Markdown stands on its own: every relative link of `README.md`,
//! `docs/*.md` and every other `*.md` in the tree names a file or folder that exists in a
//! clone, none leaves the repository (a clone has nothing beside it: no `../shared`), an
//! anchor names a heading of the page it points to, and `README.md` stays a front page.
//!
//! Links are read the way a Markdown renderer reads them: inline links and images
//! (`[text](target)`, `![alt](target)`), reference definitions (`[label]: target`), and
//! HTML `href`/`src` attributes, outside fenced code blocks, inline code and HTML
//! comments. `http(s)://` and `mailto:` links are not followed.
//!
//! The code cites the docs the same way: a comment of a `.rs` file that names a page with
//! an anchor (`docs/limits.md` plus `#the-limits`, written as one word) names a heading
//! of that page, and nothing in the tree cites the product specification the project
//! was built from, which a clone does not have: the docs state every rule themselves.

use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path, PathBuf};

use switchback_tests::binaries::workspace;

/// The front page's ceiling: about 200 lines, with room for the quickstart to grow.
const README_MAX_LINES: usize = 260;

/// One link found in a Markdown file.
#[derive(Debug)]
struct Link {
    line: usize,
    target: String,
}

fn root() -> PathBuf {
    workspace()
        .canonicalize()
        .expect("the workspace root exists")
}

/// Every `*.md` below `dir`, skipping build output and hidden folders (`.git`, `.venv`).
fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    files_below(
        dir,
        &|path| path.extension().is_some_and(|e| e == "md"),
        out,
    );
}

/// Every file below `dir` that `keep` keeps, in order, skipping build output and hidden
/// folders except `.ci` (CI's scripts, which cite docs too).
fn files_below(dir: &Path, keep: &dyn Fn(&Path) -> bool, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            let hidden = name.starts_with('.') && name != ".ci";
            if !hidden && name != "target" && name != "node_modules" {
                files_below(&path, keep, out);
            }
        } else if keep(&path) {
            out.push(path);
        }
    }
}

/// The text a renderer reads, line by line: fenced code blocks and HTML comments blanked
/// out (line numbers kept), inline code spans removed.
fn prose_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fence: Option<(char, usize)> = None;
    let mut in_comment = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if let Some((ch, len)) = fence {
            let run = trimmed.chars().take_while(|&c| c == ch).count();
            if run >= len && trimmed[run * ch.len_utf8()..].trim().is_empty() {
                fence = None;
            }
            out.push(String::new());
            continue;
        }
        if !in_comment {
            for ch in ['`', '~'] {
                let run = trimmed.chars().take_while(|&c| c == ch).count();
                if run >= 3 {
                    fence = Some((ch, run));
                }
            }
            if fence.is_some() {
                out.push(String::new());
                continue;
            }
        }
        // HTML comments, which may span lines.
        let mut kept = String::new();
        let mut rest = line;
        loop {
            if in_comment {
                match rest.find("-->") {
                    Some(end) => {
                        rest = &rest[end + 3..];
                        in_comment = false;
                    }
                    None => break,
                }
            } else {
                match rest.find("<!--") {
                    Some(start) => {
                        kept.push_str(&rest[..start]);
                        rest = &rest[start + 4..];
                        in_comment = true;
                    }
                    None => {
                        kept.push_str(rest);
                        break;
                    }
                }
            }
        }
        out.push(strip_code_spans(&kept));
    }
    out
}

/// `line` without its inline code spans (a run of backticks up to the same run).
fn strip_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let run = rest[start..].chars().take_while(|&c| c == '`').count();
        let after = &rest[start + run..];
        let closing = "`".repeat(run);
        match after.find(&closing) {
            Some(end) => rest = &after[end + run..],
            None => {
                // An unmatched backtick is literal text.
                out.push_str(&rest[start..start + run]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The destination of an inline link starting right after `](`: `<...>`, or up to the
/// first unbalanced `)` or whitespace.
fn destination(after: &str) -> Option<String> {
    let after = after.trim_start();
    if let Some(bracketed) = after.strip_prefix('<') {
        return bracketed.find('>').map(|end| bracketed[..end].to_string());
    }
    let mut depth = 0usize;
    for (i, c) in after.char_indices() {
        match c {
            '(' => depth += 1,
            ')' if depth == 0 => return Some(after[..i].to_string()),
            ')' => depth -= 1,
            c if c.is_whitespace() => return Some(after[..i].to_string()),
            _ => {}
        }
    }
    None
}

fn links(text: &str) -> Vec<Link> {
    let mut found = Vec::new();
    for (i, line) in prose_lines(text).iter().enumerate() {
        let number = i + 1;
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            if let Some(target) = destination(&rest[at + 2..]) {
                found.push(Link {
                    line: number,
                    target,
                });
            }
            rest = &rest[at + 2..];
        }
        // Reference definitions: `[label]: target`.
        let trimmed = line.trim_start();
        if line.len() - trimmed.len() <= 3
            && trimmed.starts_with('[')
            && let Some(close) = trimmed.find("]:")
            && !trimmed[..close].contains(']')
            && let Some(target) = trimmed[close + 2..].split_whitespace().next()
        {
            found.push(Link {
                line: number,
                target: target.trim_matches(['<', '>']).to_string(),
            });
        }
        // HTML attributes.
        for attr in ["href=\"", "src=\""] {
            let mut rest = line.as_str();
            while let Some(at) = rest.find(attr) {
                let value = &rest[at + attr.len()..];
                if let Some(end) = value.find('"') {
                    found.push(Link {
                        line: number,
                        target: value[..end].to_string(),
                    });
                }
                rest = value;
            }
        }
    }
    found
}

fn is_external(target: &str) -> bool {
    let lower = target.to_ascii_lowercase();
    lower.starts_with("http://") || lower.starts_with("https://") || lower.starts_with("mailto:")
}

/// `target` (a path, no fragment) from the file in `dir`, lexically, or `None` when it
/// climbs above the repository root. A leading `/` is the repository root, as on GitHub.
fn resolve(root: &Path, dir: &Path, target: &str) -> Option<PathBuf> {
    let mut path = if target.starts_with('/') {
        PathBuf::new()
    } else {
        dir.strip_prefix(root).unwrap().to_path_buf()
    };
    for component in Path::new(target.trim_start_matches('/')).components() {
        match component {
            Component::Normal(part) => path.push(part),
            Component::CurDir => {}
            Component::ParentDir => {
                if !path.pop() {
                    return None;
                }
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(root.join(path))
}

/// Percent-decoding of a link path (`docs/a%20b.md`).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && bytes[i + 1].is_ascii_hexdigit()
            && bytes[i + 2].is_ascii_hexdigit()
            && let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The anchors GitHub gives a page's headings (lowercased, punctuation dropped, spaces
/// as `-`, repeats numbered `-1`, `-2`, ...), plus explicit `id`/`name` attributes.
fn anchors(text: &str) -> Vec<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    let mut fence: Option<(char, usize)> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if let Some((ch, len)) = fence {
            let run = trimmed.chars().take_while(|&c| c == ch).count();
            if run >= len && trimmed[run * ch.len_utf8()..].trim().is_empty() {
                fence = None;
            }
            continue;
        }
        for ch in ['`', '~'] {
            let run = trimmed.chars().take_while(|&c| c == ch).count();
            if run >= 3 {
                fence = Some((ch, run));
            }
        }
        if fence.is_some() {
            continue;
        }
        for attr in ["id=\"", "name=\""] {
            let mut rest = line;
            while let Some(at) = rest.find(attr) {
                let value = &rest[at + attr.len()..];
                if let Some(end) = value.find('"') {
                    out.push(value[..end].to_string());
                }
                rest = value;
            }
        }
        let hashes = trimmed.chars().take_while(|&c| c == '#').count();
        if line.len() - trimmed.len() > 3
            || !(1..=6).contains(&hashes)
            || !trimmed[hashes..].starts_with([' ', '\t'])
        {
            continue;
        }
        let heading = trimmed[hashes..].trim().trim_end_matches('#').trim();
        // The rendered text: link targets and emphasis markers go, code keeps its text.
        let mut rendered = String::new();
        let mut rest = heading;
        while let Some(at) = rest.find("](") {
            rendered.push_str(&rest[..at]);
            let after = &rest[at + 2..];
            let skip = destination(after).map_or(0, |d| d.len());
            rest = after[skip..].strip_prefix(')').unwrap_or(&after[skip..]);
        }
        rendered.push_str(rest);
        let mut slug = String::new();
        for c in rendered.chars() {
            if c.is_alphanumeric() || c == '-' || c == '_' {
                slug.extend(c.to_lowercase());
            } else if c == ' ' {
                slug.push('-');
            }
        }
        let count = seen.entry(slug.clone()).or_insert(0);
        if *count > 0 {
            out.push(format!("{slug}-{count}"));
        } else {
            out.push(slug.clone());
        }
        *count += 1;
    }
    out
}

/// Every Markdown file with its links, paths relative to the root for messages.
fn every_link() -> (PathBuf, BTreeMap<PathBuf, Vec<Link>>) {
    let root = root();
    let mut files = Vec::new();
    markdown_files(&root, &mut files);
    let mut by_file = BTreeMap::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        by_file.insert(file, links(&text));
    }
    (root, by_file)
}

#[test]
fn every_relative_link_names_a_file_in_the_repository() {
    let (root, by_file) = every_link();
    for expected in ["README.md", "docs/chart.md", "operator/README.md"] {
        assert!(
            by_file.contains_key(&root.join(expected)),
            "{expected} was not scanned"
        );
    }
    let mut problems = Vec::new();
    let mut checked = 0;
    for (file, links) in &by_file {
        let shown = file.strip_prefix(&root).unwrap().display();
        let dir = file.parent().unwrap();
        for link in links {
            let target = link.target.as_str();
            if is_external(target) || target.starts_with('#') {
                continue;
            }
            checked += 1;
            if target.contains(':') && !target.contains('/') {
                problems.push(format!(
                    "{shown}:{}: {target}: a scheme other than http(s) or mailto",
                    link.line
                ));
                continue;
            }
            let path = percent_decode(target.split(['#', '?']).next().unwrap());
            let Some(resolved) = resolve(&root, dir, &path) else {
                problems.push(format!(
                    "{shown}:{}: {target}: leaves the repository (a clone has nothing beside it)",
                    link.line
                ));
                continue;
            };
            match resolved.canonicalize() {
                Err(_) => problems.push(format!(
                    "{shown}:{}: {target}: no such file or folder in the repository",
                    link.line
                )),
                Ok(real) if !real.starts_with(&root) => problems.push(format!(
                    "{shown}:{}: {target}: resolves outside the repository ({})",
                    link.line,
                    real.display()
                )),
                Ok(_) => {}
            }
        }
    }
    assert!(
        checked > 0,
        "no relative link found: is the scanner broken?"
    );
    assert!(
        problems.is_empty(),
        "{} broken or outside link(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn every_anchor_names_a_heading_of_its_page() {
    let (root, by_file) = every_link();
    let mut pages: HashMap<PathBuf, Vec<String>> = HashMap::new();
    let mut problems = Vec::new();
    for (file, links) in &by_file {
        let shown = file.strip_prefix(&root).unwrap().display();
        let dir = file.parent().unwrap();
        for link in links {
            let target = link.target.as_str();
            let Some((path, anchor)) = target.split_once('#') else {
                continue;
            };
            if is_external(target) || anchor.is_empty() {
                continue;
            }
            let page = if path.is_empty() {
                file.clone()
            } else {
                match resolve(&root, dir, &percent_decode(path)) {
                    Some(p) if p.is_file() => p,
                    _ => continue, // the other test reports it
                }
            };
            if page.extension().is_none_or(|e| e != "md") {
                continue; // `file.rs#L10` and the like
            }
            let names = pages
                .entry(page.clone())
                .or_insert_with(|| anchors(&std::fs::read_to_string(&page).unwrap()));
            let anchor = percent_decode(anchor).to_lowercase();
            if !names.contains(&anchor) {
                problems.push(format!(
                    "{shown}:{}: {target}: {} has no heading with the anchor #{anchor}",
                    link.line,
                    page.strip_prefix(&root).unwrap().display()
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} anchor(s) naming no heading:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// Every function name below `dir` (`fn name`), skipping build output.
fn function_names(dir: &Path, out: &mut std::collections::BTreeSet<String>) {
    let mut sources = Vec::new();
    files_below(
        dir,
        &|p| p.extension().is_some_and(|e| e == "rs"),
        &mut sources,
    );
    for path in sources {
        let text = std::fs::read_to_string(&path).unwrap();
        for rest in text.split("fn ").skip(1) {
            let ident: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            out.insert(ident);
        }
    }
}

/// The tests a page cites, as `path::test_name` in code spans (a path of ours: a file,
/// a crate `switchback_*` or a `tests` module; a test's name has two or more
/// underscores), with their line numbers.
fn cited_tests(text: &str) -> Vec<(usize, String)> {
    let mut cited = Vec::new();
    for (i, line) in text.lines().enumerate() {
        for (j, span) in line.split('`').enumerate() {
            let Some((path, name)) = span.rsplit_once("::") else {
                continue;
            };
            let ours =
                path.contains("test") || path.contains(".rs") || path.starts_with("switchback");
            let is_test = j % 2 == 1
                && ours
                && name.matches('_').count() >= 2
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if is_test {
                cited.push((i + 1, name.to_string()));
            }
        }
    }
    cited
}

/// The docs back their statements with tests by name (`docs/security.md` says each
/// statement names its test): every test a page names exists, and every statement of
/// the security model names one, so a renamed or deleted test cannot leave a claim
/// standing unbacked.
#[test]
fn every_test_the_docs_cite_exists_and_every_security_statement_cites_one() {
    let root = root();
    let mut functions = std::collections::BTreeSet::new();
    for dir in ["crds", "operator", "proxy", "tests"] {
        function_names(&root.join(dir), &mut functions);
    }
    let mut pages = Vec::new();
    markdown_files(&root, &mut pages);
    let mut problems = Vec::new();
    let mut cited_anywhere = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for (line, name) in cited_tests(&text) {
            cited_anywhere += 1;
            if !functions.contains(&name) {
                let page = page.strip_prefix(&root).unwrap().display();
                problems.push(format!("{page}:{line}: no test is named {name}"));
            }
        }
    }
    assert!(
        cited_anywhere > 20,
        "the scanner found {cited_anywhere} citations"
    );

    // The security model's statements: its bold bullets, and what a hostile client
    // cannot do. A statement is a bullet with its continuation lines.
    let security = std::fs::read_to_string(root.join("docs/security.md")).unwrap();
    let mut statements: Vec<(usize, String)> = Vec::new();
    let mut in_cannot = false;
    for (i, line) in security.lines().enumerate() {
        if line.starts_with('#') || line.starts_with("A hostile client **can**") {
            in_cannot = false;
        }
        if line.starts_with("A hostile client **cannot**") {
            in_cannot = true;
        }
        if line.starts_with("- ") {
            statements.push((i + 1, line.to_string()));
        } else if line.starts_with("  ") && !statements.is_empty() {
            statements.last_mut().unwrap().1.push_str(line);
            continue;
        } else {
            continue;
        }
        let statement = &statements.last().unwrap().1;
        if !(in_cannot || statement.starts_with("- **")) {
            statements.pop();
        }
    }
    assert!(
        statements.len() >= 15,
        "found {} statements",
        statements.len()
    );
    for (line, statement) in &statements {
        if cited_tests(statement).is_empty() {
            problems.push(format!(
                "docs/security.md:{line}: the statement cites no test: {statement}"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_readme_is_a_front_page() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines < README_MAX_LINES,
        "README.md has {lines} lines; it is the front page (under {README_MAX_LINES}): \
         move the detail to a page under docs/ and link it"
    );
}

#[test]
fn the_scanner_reads_links_as_a_renderer_does() {
    let text = "\
# Title: the `first` one
See [a](docs/a.md#part) and ![b](img/b.png \"title\"), [c](<d e.md>).
`[not](code.md)` and [f](x(1).md).
<!-- [hidden](gone.md)
     still hidden -->
```sh
[nor](this.md)
```
[ref]: ../outside.md
<a href=\"h.md\">h</a>
## Title: the first one
";
    let found: Vec<_> = links(text)
        .into_iter()
        .map(|l| (l.line, l.target))
        .collect();
    assert_eq!(
        found,
        [
            (2, "docs/a.md#part".to_string()),
            (2, "img/b.png".to_string()),
            (2, "d e.md".to_string()),
            (3, "x(1).md".to_string()),
            (9, "../outside.md".to_string()),
            (10, "h.md".to_string()),
        ]
    );
    assert_eq!(
        anchors(text),
        ["title-the-first-one", "title-the-first-one-1"]
    );
    let root = Path::new("/repo");
    assert_eq!(resolve(root, Path::new("/repo"), "../shared/SPEC.md"), None);
    assert_eq!(
        resolve(root, Path::new("/repo/docs"), "../README.md"),
        Some(PathBuf::from("/repo/README.md"))
    );
    assert_eq!(
        resolve(root, Path::new("/repo/docs"), "/crds/README.md"),
        Some(PathBuf::from("/repo/crds/README.md"))
    );
    assert_eq!(anchors("## The API (`crds/`)\n")[0], "the-api-crds");
    assert_eq!(
        anchors("## LLMClient (v1alpha1)\n")[0],
        "llmclient-v1alpha1"
    );
}

/// What cites the product specification by section: built from two parts so that this
/// file does not match itself.
const SPEC_SECTION: &str = concat!("SPEC ", "\u{a7}");

/// The files a user reads or runs: sources, docs, the chart, CI and the SDK checks.
fn cited_files(root: &Path) -> Vec<PathBuf> {
    let keep = |path: &Path| {
        let under = |dir: &str| path.components().any(|c| c.as_os_str() == dir);
        let ext = path.extension().map(|e| e.to_string_lossy().into_owned());
        under(".ci")
            || under("charts")
            || matches!(
                ext.as_deref(),
                Some("rs" | "md" | "yaml" | "yml" | "json" | "tpl" | "txt" | "py" | "toml" | "sh")
            )
    };
    let mut out = Vec::new();
    files_below(root, &keep, &mut out);
    out
}

/// Every page path with an anchor that a comment of `text` (Rust source) cites: the
/// line number, the path as written (relative to the repository root) and the anchor.
/// Only comments count (`//`, `///`, `//!`, from the first `//` of a line that is not
/// inside a string on that line); a string literal in code is data, not a citation.
fn code_references(text: &str) -> Vec<(usize, String, String)> {
    let path_char = |c: char| c.is_ascii_alphanumeric() || "_./-".contains(c);
    let anchor_char = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let Some(comment) = comment_of(line) else {
            continue;
        };
        let mut rest = comment;
        while let Some(at) = rest.find(".md#") {
            let before = &rest[..at];
            let start = before
                .char_indices()
                .rev()
                .find(|&(_, c)| !path_char(c))
                .map_or(0, |(i, c)| i + c.len_utf8());
            let after = &rest[at + 4..];
            let end = after.find(|c| !anchor_char(c)).unwrap_or(after.len());
            let path = format!("{}.md", &before[start..]);
            out.push((n + 1, path, after[..end].to_string()));
            rest = &after[end..];
        }
    }
    out
}

/// The comment part of one line of Rust: from the first `//` outside a string literal.
fn comment_of(line: &str) -> Option<&str> {
    let mut in_string = false;
    let mut escaped = false;
    let bytes = line.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
        } else if b == b'"' {
            in_string = true;
        } else if b == b'/' && bytes.get(i + 1) == Some(&b'/') {
            return Some(&line[i..]);
        }
    }
    None
}

#[test]
fn nothing_cites_the_specification_the_docs_replace() {
    let root = root();
    let files = cited_files(&root);
    for expected in [
        "proxy/src/lib.rs",
        "docs/limits.md",
        ".ci/chart",
        "charts/switchback/values.yaml",
    ] {
        assert!(
            files.contains(&root.join(expected)),
            "{expected} was not scanned"
        );
    }
    let mut problems = Vec::new();
    for file in &files {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue; // not text
        };
        for (n, line) in text.lines().enumerate() {
            if line.contains(SPEC_SECTION) {
                problems.push(format!(
                    "{}:{}: {}",
                    file.strip_prefix(&root).unwrap().display(),
                    n + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} line(s) cite the product specification, which a clone does not have: name \
         the docs page and section that states the rule (and state it there if none \
         does):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn every_docs_page_a_comment_cites_has_the_heading() {
    let root = root();
    let files = cited_files(&root);
    let mut pages: HashMap<PathBuf, Vec<String>> = HashMap::new();
    let mut problems = Vec::new();
    let mut checked = 0;
    for file in files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "rs"))
    {
        let shown = file.strip_prefix(&root).unwrap().display();
        let text = std::fs::read_to_string(file).unwrap();
        for (line, path, anchor) in code_references(&text) {
            checked += 1;
            let page = root.join(&path);
            if !page.is_file() {
                problems.push(format!(
                    "{shown}:{line}: {path}#{anchor}: no such page (paths are from the \
                     repository root)"
                ));
                continue;
            }
            let names = pages
                .entry(page.clone())
                .or_insert_with(|| anchors(&std::fs::read_to_string(&page).unwrap()));
            if !names.contains(&anchor.to_lowercase()) {
                problems.push(format!(
                    "{shown}:{line}: {path}#{anchor}: {path} has no heading with that anchor"
                ));
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} docs reference(s) found in comments: is the scanner broken?"
    );
    assert!(
        problems.is_empty(),
        "{} docs reference(s) in comments naming no heading:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn the_code_scanner_reads_comments_only() {
    let text = "\
//! Owns x (docs/limits.md#the-limits, README.md#how-it-works).
let s = \"docs/a.md#part // docs/b.md#nope\"; // see operator/README.md#rbac.
    /// `docs/streaming.md#resume-after-commit`: backticks are fine
";
    assert_eq!(
        code_references(text),
        [
            (1, "docs/limits.md".to_string(), "the-limits".to_string()),
            (1, "README.md".to_string(), "how-it-works".to_string()),
            (2, "operator/README.md".to_string(), "rbac".to_string()),
            (
                3,
                "docs/streaming.md".to_string(),
                "resume-after-commit".to_string()
            ),
        ]
    );
    assert!(SPEC_SECTION.ends_with('\u{a7}'));
}

/// docs/troubleshooting.md#every-reason-and-where-it-shows: the troubleshooting page names
/// every failure and skip reason the proxy gives, every condition reason of `compile`,
/// every target state the status shows, every key state, where probes and keys show, and
/// the Events the operator records.
#[test]
fn the_troubleshooting_page_names_every_reason_state_and_event() {
    let page = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/troubleshooting.md"),
    )
    .expect("docs/troubleshooting.md");
    let mut missing: Vec<String> = Vec::new();
    for reason in switchback_proxy::observe::reason::Reason::ALL {
        if !page.contains(&format!("`{}`", reason.as_str())) {
            missing.push(format!("reason {}", reason.as_str()));
        }
    }
    for state in switchback_crds::stats::TargetState::ALL {
        if !page.contains(&format!("`{}`", state.as_str())) {
            missing.push(format!("state {}", state.as_str()));
        }
    }
    // The condition reasons `compile` gives (PrivateNetworkNotAllowed of
    // docs/security.md#where-the-proxies-connect among them).
    for reason in switchback_crds::compile::reason::ALL {
        if !page.contains(&format!("| `{reason}` |")) {
            missing.push(format!("condition reason {reason}"));
        }
    }
    for state in switchback_crds::stats::KeyState::ALL {
        if !page.contains(&format!("`{}`", state.as_str())) {
            missing.push(format!("key state {}", state.as_str()));
        }
    }
    for field in [
        "probing",
        "lastProbe",
        "usableKeys",
        "KEYS",
        "x-switchback-model",
    ] {
        if !page.contains(field) {
            missing.push(format!("status field {field}"));
        }
    }
    for event in ["CircuitOpened", "CircuitClosed"] {
        if !page.contains(&format!("`{event}`")) {
            missing.push(format!("Event {event}"));
        }
    }
    assert!(
        missing.is_empty(),
        "docs/troubleshooting.md does not name: {}",
        missing.join(", ")
    );
}
