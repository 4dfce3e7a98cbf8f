//! The CSV job format: one job per line,
//! `priority,script_path,conda_env,arguments,allowed_gpus`.
//!
//! ```text
//! # lower priority number runs first
//! 0,/path/to/train.py,pytorch_env,--llm qwen2.5-7b-inst --epochs 100,0-3
//! 2,/path/to/inference.py,,--llm qwen2.5-32b-inst --batch_size 1,4,5,6,7
//! ```
//!
//! Only the first four commas separate fields: `allowed_gpus` may itself hold commas, so the
//! arguments cannot. Empty fields are allowed (no conda env, no arguments, any GPU). Each line
//! becomes the shell line `python <script_path> <arguments>`, with the value of `--cuda` replaced
//! by `{gpus}` so the script is told the GPUs the node agent assigned.

use std::path::Path;

use mgpu_protocol::job::{GPUS_PLACEHOLDER, shell_quote};

use super::draft::{Draft, Entry};
use crate::parse;

/// The fields, for messages about a malformed line.
const LAYOUT: &str = "priority,script_path,conda_env,arguments,allowed_gpus";

/// Every job line; `#` comments and blank lines are skipped (their numbers still count).
pub fn parse(text: &str) -> Vec<Entry> {
    text.lines()
        .enumerate()
        .filter_map(|(number, raw)| {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                return None;
            }
            Some(Entry {
                line: number + 1,
                draft: parse_line(line),
            })
        })
        .collect()
}

/// One job line.
pub fn parse_line(line: &str) -> Result<Draft, String> {
    let fields: Vec<&str> = line.splitn(5, ',').map(str::trim).collect();
    if fields.len() < 4 {
        return Err(format!(
            "expected `{LAYOUT}`, found {} field(s)",
            fields.len()
        ));
    }
    let file_priority: i32 = match fields[0] {
        "" => 0,
        text => text
            .parse()
            .map_err(|_| format!("priority `{text}` is not a whole number"))?,
    };
    // In these files a lower number runs first; in mgpu a higher one does.
    let priority = file_priority
        .checked_neg()
        .ok_or_else(|| format!("priority {file_priority} is out of range"))?;
    let script = fields[1];
    if script.is_empty() {
        return Err("the script path is empty".into());
    }
    let conda_env = Some(fields[2])
        .filter(|env| !env.is_empty())
        .map(str::to_owned);
    let arguments = rewrite_cuda(fields[3]);
    let allowed_gpus = match fields.get(4).copied().unwrap_or("") {
        "" => None,
        text => {
            let mut ids = parse::gpu_ids(text)
                .map_err(|e| format!("allowed_gpus: {e}"))?
                .0;
            ids.sort_unstable();
            ids.dedup();
            Some(ids)
        }
    };
    let mut command = format!("python {}", shell_quote(script));
    if !arguments.is_empty() {
        command.push(' ');
        command.push_str(&arguments);
    }
    let name = Path::new(script)
        .file_name()
        .and_then(|n| n.to_str())
        .map(str::to_owned);
    Ok(Draft {
        command: vec![command],
        name,
        priority,
        conda_env,
        allowed_gpus,
        // A file resubmitted while its jobs wait does not queue them twice.
        dedup: true,
        ..Draft::default()
    })
}

/// Replaces the value of `--cuda` (`--cuda 3` or `--cuda=3`) with `{gpus}`, leaving every
/// other character (spacing, quotes) as written: the value in the file names GPUs of the
/// machine it was written for, not the ones the job will get.
pub fn rewrite_cuda(arguments: &str) -> String {
    let mut out = String::with_capacity(arguments.len());
    let mut rest = arguments;
    let mut value_next = false;
    loop {
        let blank = rest
            .find(|c: char| !c.is_whitespace())
            .unwrap_or(rest.len());
        out.push_str(&rest[..blank]);
        rest = &rest[blank..];
        if rest.is_empty() {
            return out;
        }
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        let word = &rest[..end];
        if value_next {
            out.push_str(GPUS_PLACEHOLDER);
            value_next = false;
        } else if word == "--cuda" {
            out.push_str(word);
            value_next = true;
        } else if word.starts_with("--cuda=") {
            out.push_str("--cuda=");
            out.push_str(GPUS_PLACEHOLDER);
        } else {
            out.push_str(word);
        }
        rest = &rest[end..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draft(line: &str) -> Draft {
        parse_line(line).unwrap_or_else(|err| Draft {
            name: Some(format!("ERROR {err}")),
            ..Draft::default()
        })
    }

    #[test]
    fn the_example_lines_parse() {
        let train = draft("0,/path/to/train.py,pytorch_env,--llm qwen2.5-7b-inst --epochs 100,0-3");
        assert_eq!(
            train.command,
            ["python /path/to/train.py --llm qwen2.5-7b-inst --epochs 100"]
        );
        assert_eq!(train.name.as_deref(), Some("train.py"));
        assert_eq!(train.priority, 0);
        assert_eq!(train.conda_env.as_deref(), Some("pytorch_env"));
        assert_eq!(train.allowed_gpus, Some(vec![0, 1, 2, 3]));
        assert_eq!(train.gpu_ids, None, "allowed GPUs do not pin");
        assert_eq!(train.gpus, None, "left to the profile rules");
        assert!(train.dedup);

        let eval = draft("1,/path/to/eval.py,pytorch_env,--llm qwen2.5-3b-inst --dataset test,");
        assert_eq!(
            eval.command,
            ["python /path/to/eval.py --llm qwen2.5-3b-inst --dataset test"]
        );
        assert_eq!(eval.priority, -1, "a lower file number runs first");
        assert_eq!(eval.allowed_gpus, None);

        let infer = draft("2,/path/to/inference.py,,--llm qwen2.5-32b-inst --batch_size 1,4,5,6,7");
        assert_eq!(
            infer.command,
            ["python /path/to/inference.py --llm qwen2.5-32b-inst --batch_size 1"]
        );
        assert_eq!(infer.conda_env, None);
        assert_eq!(infer.priority, -2);
        assert_eq!(infer.allowed_gpus, Some(vec![4, 5, 6, 7]));
    }

    #[test]
    fn comments_and_blank_lines_are_skipped_but_counted() {
        let text = "# header\n\n0,a.py,,,\n   # indented comment\n1,b.py,,--x 1,\n";
        let entries = parse(text);
        let lines: Vec<usize> = entries.iter().map(|e| e.line).collect();
        assert_eq!(lines, [3, 5]);
        assert!(entries.iter().all(|e| e.draft.is_ok()));
    }

    #[test]
    fn empty_fields_and_a_missing_last_field_are_fine() {
        let bare = draft(",run.py,,");
        assert_eq!(bare.command, ["python run.py"]);
        assert_eq!(bare.priority, 0);
        assert_eq!(bare.allowed_gpus, None);
        let spaced = draft(" 3 , /x/my script.py , env , --a 1 , 1-2 ");
        assert_eq!(spaced.command, ["python '/x/my script.py' --a 1"]);
        assert_eq!(spaced.name.as_deref(), Some("my script.py"));
        assert_eq!(spaced.allowed_gpus, Some(vec![1, 2]));
        assert_eq!(draft("0,a.py,,,3,1,3").allowed_gpus, Some(vec![1, 3]));
    }

    #[test]
    fn bad_lines_say_what_is_wrong() {
        let err = |line: &str| parse_line(line).err().unwrap_or_default();
        assert!(err("0,a.py").contains("expected `priority,script_path"));
        assert!(err("x,a.py,,,").contains("priority `x` is not a whole number"));
        assert!(err("0,,env,,").contains("script path is empty"));
        assert!(err("0,a.py,,,0-x").contains("allowed_gpus"));
        assert!(err("-2147483648,a.py,,,").contains("out of range"));
    }

    #[test]
    fn the_cuda_value_becomes_the_placeholder() {
        assert_eq!(
            rewrite_cuda("--cuda 3 --epochs 2"),
            "--cuda {gpus} --epochs 2"
        );
        assert_eq!(
            rewrite_cuda("--epochs 2  --cuda=0,1"),
            "--epochs 2  --cuda={gpus}"
        );
        assert_eq!(rewrite_cuda("--cuda\t7"), "--cuda\t{gpus}");
        assert_eq!(
            rewrite_cuda("--cuda"),
            "--cuda",
            "no value, nothing to replace"
        );
        assert_eq!(
            rewrite_cuda("--cudax 1 --no-cuda 2"),
            "--cudax 1 --no-cuda 2"
        );
        assert_eq!(rewrite_cuda(""), "");
        let line = draft("0,t.py,,--llm m --cuda 5,");
        assert_eq!(line.command, ["python t.py --llm m --cuda {gpus}"]);
    }
}
