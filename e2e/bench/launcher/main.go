// Command launch runs one CNI plugin the way libcni does (exec.Cmd, stdin from a buffer,
// stdout and stderr into buffers) and reports what the runtime would see: the wall time of
// the exec, the exit status and the plugin's peak RSS.
//
// Usage: launch TIMEOUT_MS PLUGIN   (environment = the plugin's; stdin = its config)
//
// The plugin's stdout and stderr are copied to ours after it exits; one JSON line with
// status, elapsed_ns, maxrss_kib and timed_out goes to fd 3.
//
// Why a launcher: ru_maxrss of a child counts the memory of the process that exec'd it (the
// kernel records the old mm's high-water mark at exec), so a plugin started straight from the
// Python bench would report at least the bench's own ~40 MiB. Started from this small
// process, a plugin's peak RSS is its own.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
)

type report struct {
	Status    int   `json:"status"`
	ElapsedNs int64 `json:"elapsed_ns"`
	MaxRSSKiB int64 `json:"maxrss_kib"`
	TimedOut  bool  `json:"timed_out"`
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: launch TIMEOUT_MS PLUGIN")
		os.Exit(2)
	}
	timeoutMs, err := strconv.Atoi(os.Args[1])
	if err != nil {
		fmt.Fprintf(os.Stderr, "launch: bad timeout %q\n", os.Args[1])
		os.Exit(2)
	}
	result := os.NewFile(3, "result")
	config, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "launch: reading stdin: %v\n", err)
		os.Exit(2)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(os.Args[2])
	cmd.Env = os.Environ()
	cmd.Stdin = bytes.NewBuffer(config)
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	// A killed plugin's children may hold its stdout open; stop waiting for them after this.
	cmd.WaitDelay = time.Second

	started := time.Now()
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "launch: starting %s: %v\n", os.Args[2], err)
		os.Exit(2)
	}
	var timedOut atomic.Bool
	timer := time.AfterFunc(time.Duration(timeoutMs)*time.Millisecond, func() {
		timedOut.Store(true)
		_ = cmd.Process.Kill()
	})
	_ = cmd.Wait() // a non-zero exit is a result, not an error of ours
	elapsed := time.Since(started)
	timer.Stop()

	out := report{ElapsedNs: elapsed.Nanoseconds(), TimedOut: timedOut.Load()}
	if state := cmd.ProcessState; state != nil {
		out.Status = state.ExitCode()
		if ws, ok := state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			out.Status = -int(ws.Signal())
		}
		if usage, ok := state.SysUsage().(*syscall.Rusage); ok {
			out.MaxRSSKiB = usage.Maxrss
		}
	}
	_, _ = os.Stdout.Write(stdout.Bytes())
	_, _ = os.Stderr.Write(stderr.Bytes())
	line, _ := json.Marshal(out)
	_, _ = result.Write(append(line, '\n'))
}
