package main

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// readmeBlock is one indented (shell) code block of the README and the section it is in.
type readmeBlock struct {
	section string
	text    string
}

// readmeDocs are the README and every page of docs/: the documents whose blocks the tests run.
func readmeDocs(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob("../../docs/*.md")
	require.NoError(t, err)
	require.NotEmpty(t, docs, "docs/ has the README's linked pages")
	return append([]string{"../../README.md"}, docs...)
}

// readmeBlocks returns the indented code blocks (four spaces after a blank line, outside fenced
// blocks), the form the documents use for shell commands, of the README and every docs/ page.
func readmeBlocks(t *testing.T) []readmeBlock {
	t.Helper()
	var out []readmeBlock
	for _, doc := range readmeDocs(t) {
		b, err := os.ReadFile(doc)
		require.NoError(t, err)
		out = append(out, docBlocks(string(b))...)
	}
	return out
}

// docBlocks returns one document's indented code blocks, each with its "## " section.
func docBlocks(doc string) []readmeBlock {
	var out []readmeBlock
	var section string
	var cur []string
	fenced, prevBlank := false, true
	flush := func() {
		if len(cur) > 0 {
			out = append(out, readmeBlock{section, strings.Join(cur, "\n") + "\n"})
			cur = nil
		}
	}
	for _, line := range strings.Split(doc, "\n") {
		switch {
		case strings.HasPrefix(line, "```"):
			flush()
			fenced = !fenced
		case fenced:
		case strings.HasPrefix(line, "    ") && (len(cur) > 0 || prevBlank):
			cur = append(cur, strings.TrimPrefix(line, "    "))
		default:
			flush()
			if s, ok := strings.CutPrefix(line, "## "); ok {
				section = s
			}
		}
		prevBlank = strings.TrimSpace(line) == ""
	}
	flush()
	return out
}

// readmeNotRun lists the README's shell blocks TestREADME does not run, by their first line,
// with where they are checked instead. A block in neither list fails the test, so a new block
// is run or accounted for.
var readmeNotRun = map[string]string{
	"go run ./cmd/shmsteer demo": ".ci/run runs the demo",
	"PYTHONPATH=python python python/benchmarks/gpu_check.py --out report.md": "TestGPUCheckCPU in capi runs it with --quick",
	"go test ./...": "it is the command that runs this test",
	"export SHMSTEER_PYTHON=$(bash .ci/pyenv)":                     ".ci/run runs .ci/pyenv and the tests with it",
	"shmsteer serve --namespace prod --hidden 4096 --layers 32 \\": "the README's short form of docs/service.md's start, which TestREADME runs",
	"go generate ./capi":                                                                             "capi's TestPythonVenvInstall runs these lines (here the generate would rewrite the library capi's tests load in the same go test ./...)",
	"nats-server -js -sd /var/lib/nats &":                                                            "the several-hosts example needs nats-server and several hosts; TestServeMirrorTwoHosts runs it",
	"go run ./cmd/shmsteer bench --json out.json --plot out.png":                                     "minutes of benchmarks; bench's tests run its parts",
	"go run ./cmd/shmsteer bench --json runN.json":                                                   "minutes of benchmarks; bench's tests run its parts (--summarize: TestSummarizeFiles)",
	"go test -run '^$' -bench . ./shm/ ./ipc/ ./kernels/ ./steer/":                                   "benchmarks",
	"cd python && PYTHONPATH=. python benchmarks/decode_loop.py --rounds 11 [--json] [--check]":      "minutes of benchmarks; .ci/run runs the same bench in its short mode with --check",
	"cd python && PYTHONPATH=. python benchmarks/decode_loop.py --dtypes bfloat16 --rounds 5 --json": "minutes of benchmarks; .ci/run runs the same bench in its short mode with --check",
	`llm = LLM(model="/path/to/model", skip_tokenizer_init=True, dtype="float32",`:                   "needs vLLM; python/tests/vllm_compile_run.py runs the same LLM under torch.compile (test_vllm_compile_e2e.py checks it)",
	"SHMSTEER_LIB=$PWD/python/shmsteer/libshmsteer.so PYTHONPATH=$PWD/python \\":                     "minutes of benchmarks in vLLM's environment (docs/vllm.md's figure)",
	"... python/benchmarks/vllm_step.py --rounds 31 --max-tokens 16 --compile [--profile]":           "minutes of benchmarks in vLLM's environment (docs/vllm.md's figure)",
	"cd python && VLLM_CPU_KVCACHE_SPACE=1 PYTHONPATH=. ~/.cache/shmsteer/vllm-venv/bin/python \\":   "minutes of benchmarks in vLLM's environment (docs/vllm.md's figure on the AVX-512 VM)",
	"bash .ci/pyenv-vllm": "installs vLLM's CPU build (21 minutes, 6.3 GB); python/tests/test_vllm_*.py run with the interpreter it prints",
	"export SHMSTEER_VLLM=1 SHMSTEER_SECRET=$(head -c 32 /dev/urandom | base64) VLLM_CPU_KVCACHE_SPACE=1": "needs vLLM; python/tests/vllm_e2e_run.py runs the same generate (and test_vllm_e2e.py checks it)",
}

// blockKey is a block's first command (its first line that is not only a comment), without
// its comment: what readmeNotRun is keyed by.
func blockKey(text string) string {
	for _, line := range strings.Split(text, "\n") {
		cmd, _, _ := strings.Cut(line, "#")
		if cmd = strings.TrimSpace(cmd); cmd != "" {
			return cmd
		}
	}
	return ""
}

// TestREADME runs the README's service quick start as a new user pastes it, in one bash, from
// the checkout: the block that builds the binary into a fresh directory and starts serve, the
// API calls, the vector-file CLI lines, the CLI's client commands and the SIGTERM. The one
// change made to the text is the listening address (a free port instead of 8677, so parallel
// runs do not collide); TMPDIR is the test's, so the quick start's directory is removed after.
func TestREADME(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds the binary and runs serve")
	}
	for _, tool := range []string{"bash", "curl", "python3", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not on PATH: %v", tool, err)
		}
	}
	blocks := readmeBlocks(t)
	var service, files, library, capture []string
	for _, b := range blocks {
		switch {
		case b.section == "Run the owner as a service":
			service = append(service, b.text)
		case b.section == "Activation capture":
			capture = append(capture, b.text)
		case b.section == "Steering vectors from files":
			files = append(files, b.text)
		case b.section == "Use as a library":
			library = append(library, b.text)
		default:
			_, known := readmeNotRun[blockKey(b.text)]
			require.True(t, known, "README block in %q is neither run by TestREADME nor listed in readmeNotRun:\n%s", b.section, b.text)
		}
	}
	require.Len(t, service, 4, "the service section's blocks: start, API calls, CLI, SIGTERM")
	require.Len(t, files, 1, "the vector-file section's CLI block")
	require.Len(t, library, 1, "the library section's clone and replace lines")
	require.Len(t, capture, 3, "the capture section's blocks: start, admit to result, SIGTERM")
	t.Run("library from a clone", func(t *testing.T) { readmeLibrary(t, library[0]) })
	t.Run("activation capture", func(t *testing.T) { readmeCapture(t, strings.Join(capture, "")) })

	// The vector-file block attaches to the quick start's serve: it runs after the API calls.
	script := strings.Join([]string{service[0], service[1], files[0], service[2], service[3]}, "")
	addr, log := runReadmeScript(t, script, "127.0.0.1:8677")

	// What a reader is told to expect.
	for _, want := range []string{
		"listening on " + addr,
		`"layers_updated":[20]`,
		`"name":"polite"`,
		`"name":"happy"`,
		`"active_layers"`,
		"shmsteer_build_info{",
		"polite",
		"global steering set at version",
		"shutting down",
	} {
		require.Contains(t, log, want, "README run output")
	}
	// Nothing the quick start writes lands in the checkout.
	st, err := exec.Command("git", "-C", "../..", "status", "--porcelain", "--ignored", "--", "api-keys", "state", "happy.gguf", "happy.npz").Output()
	require.NoError(t, err)
	require.Empty(t, strings.TrimSpace(string(st)), "the quick start wrote into the checkout")
	sc := bufio.NewScanner(strings.NewReader(log))
	for sc.Scan() {
		require.NotContains(t, sc.Text(), "shmsteer: shmsteer:", "one prefix per error")
	}
}

// readmeLibrary runs docs/library.md's lines: a clone of this checkout (the page's
// /path/to/shmsteer) next to a module holding the page's program, the replace directive, and
// the program built and run.
func readmeLibrary(t *testing.T, block string) {
	b, err := os.ReadFile("../../docs/library.md")
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(b), "## Use as a library")
	require.True(t, ok)
	_, rest, ok = strings.Cut(rest, "```go\n")
	require.True(t, ok, "the library section's Go program")
	prog, _, ok := strings.Cut(rest, "```")
	require.True(t, ok)
	repo, err := filepath.Abs("../..")
	require.NoError(t, err)
	dir := t.TempDir()
	mod := filepath.Join(dir, "your-module")
	require.NoError(t, os.Mkdir(mod, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(mod, "main.go"), []byte(prog), 0o644))
	run := func(dir, script string) string {
		cmd := exec.Command("bash", "-c", "set -euo pipefail\n"+script)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s\n%s", script, out)
		return string(out)
	}
	run(mod, "go mod init example.com/your-module")
	run(dir, strings.ReplaceAll(block, "/path/to/shmsteer", repo))
	run(mod, "go build -o app .")
	out := run(mod, "SHMSTEER_SECRET=readme-library APP_NAMESPACE=readme-"+strconv.Itoa(os.Getpid())+" ./app")
	require.Contains(t, out, "key of r1: [0.5 0 0 0 0.5 0 0 0]")
}

// readmeCapture runs the capture section's blocks in one bash from the checkout, as the
// service section's are run (a free port instead of 8678, the test's TMPDIR), and checks what
// the reader is told to expect: the consumer attached, the result ok with the paths, the
// sidecar's shape and positions, the metrics.
func readmeCapture(t *testing.T, script string) {
	_, log := runReadmeScript(t, script, "127.0.0.1:8678")
	for _, want := range []string{
		`capture fs: attached as consumer "fs"`,
		`"status":"ok","error":null,"payload":["`,
		"/demo/r1/0_post_block.bin",
		"3_post_block.json",
		`"shape":[6,64]`,
		`"positions":[0,1,2,3,4,5]`,
		"shmsteer_capture_records_total 6",
		"captureworker: stepped r1",
		"capture fs: 1 requests (1 ok",
	} {
		require.Contains(t, log, want, "README capture run output")
	}
}

// runReadmeScript runs README blocks in one bash from the checkout, as a new user pastes them,
// with the one change the harness makes: a free port on 127.0.0.1 instead of the blocks' port
// (so parallel runs do not collide), and TMPDIR the test's (so their directories are removed
// after). It stops at the first failure, never leaves serve or a consumer running, and returns
// the address used and the output.
func runReadmeScript(t *testing.T, script, port string) (string, string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	l.Close()
	script = strings.ReplaceAll(script, port, addr)
	require.Equal(t, 0, strings.Count(script, strings.TrimPrefix(port, "127.0.0.1:")), "every use of the port is the address")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// The harness's only lines: stop on the first failure, and never leave serve running.
	cmd := exec.CommandContext(ctx, "bash", "-c", "set -euo pipefail\ntrap 'kill -9 ${SERVE:-} ${CONSUMER:-} 2>/dev/null || true' EXIT\n"+script)
	cmd.Dir = "../.."
	env := []string{"TMPDIR=" + t.TempDir()}
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "SHMSTEER_") && !strings.HasPrefix(e, "TMPDIR=") {
			env = append(env, e)
		}
	}
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	log := out.String()
	require.NoError(t, err, "the README's blocks failed:\n%s", log)
	return addr, log
}

// The README is what a newcomer reads in five minutes: at most 350 lines, linking every page of
// docs/ (where the detail lives), and every docs/ page links back.
func TestREADMEShort(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	readme := string(b)
	require.LessOrEqual(t, strings.Count(readme, "\n"), 350, "README.md is over 350 lines: move detail to docs/")
	for _, doc := range readmeDocs(t)[1:] {
		name := "docs/" + filepath.Base(doc)
		require.Contains(t, readme, "("+name+")", "the README links %s", name)
		page, err := os.ReadFile(doc)
		require.NoError(t, err)
		require.Contains(t, string(page), "(../README.md)", "%s links back to the README", name)
	}
}
