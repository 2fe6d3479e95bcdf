//! The matrices of `docs/support-matrix.md` and `docs/support-matrix.html`: the questions
//! people ask, each as the `attn-policy matrix` command that answers it.
//! `analysis/tests/docs.rs` fails when the files differ from what the rules produce
//! (`UPDATE_DOCS=1` regenerates them); `analysis/benches/matrix.rs` times each one.

use attn_policy::Policy;

use super::{AxisQuery, Free, Matrix, MatrixError, Query, build, html_page};

/// One question of the docs: a title, a sentence, and the command's arguments.
pub struct Question {
    pub title: &'static str,
    pub intro: &'static str,
    /// `attn-policy matrix` arguments (`--pack`, `--rows`, `--cols`, `--fix`, `--free`).
    pub args: &'static [&'static str],
}

/// The te environment of the docs (as the decision grid, docs/analysis.md): flash-attn 2.7.4
/// only, cuDNN 9.19.0, cudnn-frontend 1.29.0, cutlass-dsl 4.7.1, bshd layout.
macro_rules! te_env {
    () => {
        concat!(
            "--fix flash_attn_versions.v2=2.7.4 --fix cudnn_version=9.19.0 ",
            "--fix cudnn_frontend_version=1.29.0 --fix cutlass_dsl_version=4.7.1 ",
            "--fix qkv_layout=bshd_bshd_bshd"
        )
    };
}

pub const QUESTIONS: &[Question] = &[
    Question {
        title: "TransformerEngine: head dim × architecture, bf16 causal training",
        intro: "Which backend TransformerEngine 2.20 (with FROST) runs for each head dim on each GPU generation.",
        args: &[
            "--pack te --rows head_dim --cols sm --fix qkv_dtype=bf16 --fix attn_mask_type=causal --fix is_training=true",
            te_env!(),
        ],
    },
    Question {
        title: "TransformerEngine: mask × architecture, head dim 128, bf16 training",
        intro: "Which backend runs for each attention mask type.",
        args: &[
            "--pack te --rows attn_mask_type --cols sm --fix head_dim=128 --fix qkv_dtype=bf16 --fix is_training=true",
            te_env!(),
        ],
    },
    Question {
        title: "TransformerEngine: context-parallel comm type × head dim on Blackwell (sm100), bf16 causal training",
        intro: "Context parallelism by communication type on B200 (FROST serves head dims in (256, 512]).",
        args: &[
            "--pack te --rows cp_comm_type --cols head_dim --fix sm=100 --fix qkv_dtype=bf16 --fix attn_mask_type=causal --fix is_training=true",
            te_env!(),
        ],
    },
    Question {
        title: "TransformerEngine: context-parallel comm type × head dim on Hopper (sm90), bf16 causal training",
        intro: "The same on H100/H200, where no backend serves head dims above 256 under context parallelism.",
        args: &[
            "--pack te --rows cp_comm_type --cols head_dim --fix sm=90 --fix qkv_dtype=bf16 --fix attn_mask_type=causal --fix is_training=true",
            te_env!(),
        ],
    },
    Question {
        title: "PyTorch SDPA: head dim × architecture, bf16 causal training",
        intro: "Which backend `torch.nn.functional.scaled_dot_product_attention` (PyTorch 2.11) picks on CUDA, with key and value shaped like the query (docs/packs/torch.md).",
        args: &[
            "--pack torch --rows head_dim --cols sm --fix dtype=bf16 --fix is_causal=true --fix requires_grad=true",
        ],
    },
    Question {
        title: "PyTorch SDPA: dtype × architecture, head dim 128, inference without a mask",
        intro: "The same per dtype, for inference (no gradient).",
        args: &[
            "--pack torch --rows dtype=fp16,bf16,fp32,fp64,fp8_e4m3fn --cols sm --fix head_dim=128 --fix requires_grad=false",
        ],
    },
    Question {
        title: "native: head dim × dtype on sm90, causal",
        intro: "This project's own executors (docs/executors.md).",
        args: &[
            "--pack native --rows head_dim --cols qkv_dtype --fix sm=90 --fix attn_mask_type=causal --fix qkv_layout=bshd_bshd_bshd",
        ],
    },
];

impl Question {
    /// The arguments as words (each `&str` of `args` split at spaces).
    pub fn words(&self) -> Vec<&'static str> {
        self.args.iter().flat_map(|a| a.split(' ')).collect()
    }

    /// The command line (for the docs).
    pub fn command(&self) -> String {
        let quoted: Vec<String> = self
            .words()
            .iter()
            .map(|w| {
                if w.contains(['[', ']', '+', '"', ' ']) {
                    format!("'{w}'")
                } else {
                    w.to_string()
                }
            })
            .collect();
        format!("attn-policy matrix {}", quoted.join(" "))
    }

    /// The pack name and the query the arguments describe.
    pub fn query(&self) -> Result<(String, Query), MatrixError> {
        let words = self.words();
        let (mut pack, mut rows, mut cols, mut fix, mut free) =
            ("te".to_string(), None, None, Vec::new(), Free::Shape);
        let mut it = words.iter();
        while let Some(&flag) = it.next() {
            let value = it
                .next()
                .ok_or_else(|| MatrixError::Bad(format!("{flag} needs a value")))?;
            match flag {
                "--pack" => pack = value.to_string(),
                "--rows" => rows = Some(AxisQuery::parse(value)),
                "--cols" => cols = Some(AxisQuery::parse(value)),
                "--fix" => fix.push(Query::parse_fix(value)),
                "--free" => free = Free::parse(value),
                other => return Err(MatrixError::Bad(format!("unknown flag {other}"))),
            }
        }
        let need = |a: Option<AxisQuery>, f: &str| {
            a.ok_or_else(|| MatrixError::Bad(format!("{f} missing")))
        };
        Ok((
            pack,
            Query {
                rows: need(rows, "--rows")?,
                cols: need(cols, "--cols")?,
                fix,
                free,
            },
        ))
    }

    /// Loads the pack (embedded) and builds the matrix.
    pub fn build(&self, budget: u64) -> Result<Matrix, MatrixError> {
        let (pack, q) = self.query()?;
        let policy =
            Policy::embedded(&pack).map_err(|e| MatrixError::Bad(format!("pack {pack}: {e:?}")))?;
        build(&policy, &q, budget)
    }
}

const TITLE: &str = "Support matrices";

const PREAMBLE: &str = "Generated from the rules by `attn-policy matrix` (docs/matrix.md says \
what a cell, a mark and the caption mean); `analysis/tests/docs.rs` fails when these files \
differ from what the rules produce (regenerate them with \
`UPDATE_DOCS=1 cargo test -p attn-policy-analysis --test docs`).";

/// The Markdown document of the built questions.
pub fn markdown(built: &[(&Question, Matrix)]) -> String {
    let mut out = format!(
        "# {TITLE}\n\n{PREAMBLE} The same matrices with every cell's full explanation (hover or \
         click a cell): [support-matrix.html](support-matrix.html).\n"
    );
    for (q, m) in built {
        out.push_str(&format!(
            "\n## {}\n\n{}\n\n```sh\n{}\n```\n\n{}",
            q.title,
            q.intro,
            q.command(),
            m.to_markdown()
        ));
    }
    out
}

/// The HTML page of the built questions.
pub fn html(built: &[(&Question, Matrix)]) -> String {
    let sections: Vec<(String, String, &Matrix)> = built
        .iter()
        .map(|(q, m)| {
            (
                q.title.to_string(),
                format!("{} `{}`", q.intro, q.command()),
                m,
            )
        })
        .collect();
    html_page(TITLE, PREAMBLE, &sections)
}
