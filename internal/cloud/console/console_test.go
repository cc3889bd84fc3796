package console

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// startShell starts an interactive shell on a new pseudo-terminal, as
// getty starts one on a serial port: the terminal echoes, turns newlines
// into CRLF and sends SIGINT on Ctrl-C. It returns the terminal's master
// side, the test's end of the line, and the path of its other side, the
// shell's terminal.
func startShell(t *testing.T, argv ...string) (*os.File, string) {
	t.Helper()
	if _, err := exec.LookPath(argv[0]); err != nil {
		t.Skipf("%s not installed", argv[0])
	}
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open a pseudo-terminal: %v", err)
	}
	t.Cleanup(func() { ptmx.Close() })
	// Through SyscallConn, not Fd, which would make ptmx blocking and
	// rule out deadlines.
	var n int
	raw, err := ptmx.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var ioctlErr error
	if err := raw.Control(func(fd uintptr) {
		if ioctlErr = unix.IoctlSetPointerInt(int(fd), unix.TIOCSPTLCK, 0); ioctlErr == nil {
			n, ioctlErr = unix.IoctlGetInt(int(fd), unix.TIOCGPTN)
		}
	}); err != nil || ioctlErr != nil {
		t.Fatalf("unlock the pseudo-terminal: %v %v", err, ioctlErr)
	}
	tty := "/dev/pts/" + strconv.Itoa(n)
	pts, err := os.OpenFile(tty, os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer pts.Close()

	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = pts, pts, pts
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "TERM=vt220", "PS1=root@node:~# "}
	// Its own session with the terminal as controlling terminal, for job
	// control and Ctrl-C.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Closing the terminal hangs up the shell and its jobs.
		ptmx.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	return ptmx, tty
}

// shells are the shells Run is tested with: bash with readline, as on the
// debug image, and a shell that reads the terminal line by line.
var shells = map[string][]string{
	"bash": {"bash", "--norc", "--noprofile", "-i"},
	"dash": {"dash", "-i"},
}

func TestRun(t *testing.T) {
	var lines strings.Builder
	for i := 1; i <= 3000; i++ {
		fmt.Fprintf(&lines, "%d\n", i)
	}
	tests := []struct {
		name     string
		command  string
		want     string
		wantCode int
		// orWant is another output some shells give.
		orWant string
	}{
		{name: "many lines", command: "seq 1 3000", want: lines.String()},
		{name: "non-zero exit and stderr", command: "echo oops >&2; exit 3", want: "oops\n", wantCode: 3},
		{name: "no output", command: "true"},
		{name: "no output, failing", command: "false", wantCode: 1},
		{name: "no final newline", command: "printf abc", want: "abc"},
		{name: "quotes", command: `printf '%s\n' "it's" 'a "b"'`, want: "it's\na \"b\"\n"},
		{name: "stdin is not the line", command: "cat; echo read nothing", want: "read nothing\n"},
		{name: "pagers are off", command: `echo "$SYSTEMD_PAGER $PAGER $SYSTEMD_COLORS $COLUMNS"`, want: "cat cat 0 200\n"},
		{name: "a marker word in the output", command: "echo ORRBEGIN-x ORREND-y:1", want: "ORRBEGIN-x ORREND-y:1\n"},
		// bash keeps its notice out of the pipe, dash does not.
		{name: "killed by a signal", command: "kill -TERM $$", wantCode: 128 + 15, orWant: "Terminated\n"},
	}
	for shell, argv := range shells {
		t.Run(shell, func(t *testing.T) {
			line, _ := startShell(t, argv...)
			// One shell for all cases: each Run must leave it ready for
			// the next.
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					defer cancel()
					got, code, err := Run(ctx, line, tc.command)
					if err != nil {
						t.Fatal(err)
					}
					if got != tc.want && (tc.orWant == "" || got != tc.orWant) || code != tc.wantCode {
						t.Errorf("Run(%q) = %q, %d; want %q, %d", tc.command, head(got), code, head(tc.want), tc.wantCode)
					}
				})
			}
		})
	}
}

func head(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}

// TestRunIgnoresNoise: what the line shows before the output, even stale
// markers of another nonce, stays out of it.
func TestRunIgnoresNoise(t *testing.T) {
	noise := `printf '[   12.345] kernel: noise\nORRREADY-0\nORRBEGIN-0\nstale\nORREND-0:7\n'`
	line, _ := startShell(t, "bash", "--norc", "--noprofile", "-c", noise+"; exec bash --norc --noprofile -i")
	runsFresh(t, line)
}

// runsFresh checks that "echo fresh" on line gives exactly its output.
func runsFresh(t *testing.T, line *os.File) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got, code, err := Run(ctx, line, "echo fresh")
	if err != nil || got != "fresh\n" || code != 0 {
		t.Fatalf("Run() = %q, %d, %v; want \"fresh\\n\", 0, nil", got, code, err)
	}
}

// TestRunAfterHalfTypedLine: a line someone left half-typed swallows the
// first probe, not the command.
func TestRunAfterHalfTypedLine(t *testing.T) {
	line, _ := startShell(t, shells["bash"]...)
	if _, err := line.WriteString("echo half-typed "); err != nil {
		t.Fatal(err)
	}
	runsFresh(t, line)
}

// TestRunDropsConsoleNoise: lines another program writes to the terminal
// while the command runs, as journald forwards the journal to the
// console, stay out of the output.
func TestRunDropsConsoleNoise(t *testing.T) {
	line, tty := startShell(t, shells["bash"]...)
	console, err := os.OpenFile(tty, os.O_WRONLY|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer console.Close()
	stop := make(chan struct{})
	wrote := make(chan int)
	go func() {
		n := 0
		defer func() { wrote <- n }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			// One write per line, as journald does.
			fmt.Fprintf(console, "[   29.%06d] systemd[1]: noise %d\n", n, n)
			n++
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var want strings.Builder
	for i := 1; i <= 20000; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	got, code, err := Run(ctx, line, "seq 1 20000")
	close(stop)
	n := <-wrote
	if err != nil || code != 0 {
		t.Fatalf("Run() = %d, %v", code, err)
	}
	if got != want.String() {
		t.Errorf("output with %d noise lines around it: %d bytes, want %d:\n%s", n, len(got), want.Len(), head(got))
	}
	t.Logf("%d noise lines written during the command", n)
}

// TestRunInterruptsHungCommand: a command that outlives ctx is interrupted,
// and the shell serves the next Run.
func TestRunInterruptsHungCommand(t *testing.T) {
	line, _ := startShell(t, shells["bash"]...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	got, code, err := Run(ctx, line, "echo started; sleep 60")
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrNoShell) {
		t.Fatalf("Run() error = %v, want a deadline error that is not ErrNoShell", err)
	}
	if took := time.Since(start); took > 4*time.Second {
		t.Errorf("Run() returned %v after the start, want about its 2 s deadline", took)
	}
	if got != "started\n" || code != -1 {
		t.Errorf("Run() = %q, %d; want the output so far, \"started\\n\", and -1", got, code)
	}
	t.Logf("error: %v", err)

	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if got, code, err := Run(ctx, line, "echo next"); err != nil || got != "next\n" || code != 0 {
		t.Fatalf("Run() after the interrupted command = %q, %d, %v", got, code, err)
	}
}

// TestRunNoShell: a line where no shell answers, silent or echoing what it
// is sent, ends in ErrNoShell at ctx's deadline.
func TestRunNoShell(t *testing.T) {
	tests := map[string]struct {
		pipe     func() (net.Conn, net.Conn)
		peerDoes func(peer net.Conn)
	}{
		"silent": {pipe: socketPair(t), peerDoes: func(peer net.Conn) { io.Copy(io.Discard, peer) }},
		// A terminal with no one reading it echoes what it is sent.
		"echo": {pipe: socketPair(t), peerDoes: func(peer net.Conn) { io.Copy(peer, peer) }},
		// Not even the typed bytes are taken: writing blocks.
		"deaf": {pipe: net.Pipe, peerDoes: func(peer net.Conn) {}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			line, peer := tc.pipe()
			defer line.Close()
			defer peer.Close()
			go tc.peerDoes(peer)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			start := time.Now()
			_, code, err := Run(ctx, line, "systemctl status bootstrapperd")
			if !errors.Is(err, ErrNoShell) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Run() error = %v, want ErrNoShell and DeadlineExceeded", err)
			}
			if !strings.Contains(err.Error(), "make image DEBUG=1") {
				t.Errorf("error %q does not say how to get a debug image", err)
			}
			if took := time.Since(start); took < 3*time.Second || took > 5*time.Second {
				t.Errorf("Run() returned after %v, want its 3 s deadline", took)
			}
			if code != -1 {
				t.Errorf("exit status %d, want -1", code)
			}
			t.Logf("error: %v", err)
		})
	}
}

// TestRunCancel: cancelling ctx, not only its deadline, ends a Run blocked
// on the line.
func TestRunCancel(t *testing.T) {
	line, peer := net.Pipe()
	defer line.Close()
	defer peer.Close()
	go func() {
		// Take the typed bytes until the cancel, then leave the pipe
		// for the check below.
		buf := make([]byte, 1024)
		peer.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		for {
			if _, err := peer.Read(buf); err != nil {
				return
			}
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	_, _, err := Run(ctx, line, "true")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run() error = %v, want context.Canceled", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Run() returned %v after the start, want soon after the cancel", took)
	}
	// Run cleared the deadline it had set: the line still works.
	go peer.Write([]byte("x"))
	if _, err := line.Read(make([]byte, 1)); err != nil {
		t.Errorf("read after Run: %v", err)
	}
}

// socketPair returns a function that makes two connected sockets, which
// unlike net.Pipe buffer what is written.
func socketPair(t *testing.T) func() (net.Conn, net.Conn) {
	return func() (net.Conn, net.Conn) {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		var conns [2]net.Conn
		for i, fd := range fds {
			f := os.NewFile(uintptr(fd), "socketpair")
			if conns[i], err = net.FileConn(f); err != nil {
				t.Fatal(err)
			}
			f.Close()
		}
		return conns[0], conns[1]
	}
}

func TestRunRefusesCommand(t *testing.T) {
	tests := map[string]struct {
		command string
		wantErr string
	}{
		"empty":           {command: "  ", wantErr: "empty"},
		"newline":         {command: "echo a\necho b", wantErr: "printf escapes"},
		"Ctrl-C":          {command: "echo \x03", wantErr: "printf escapes"},
		"tab":             {command: "echo\ta", wantErr: "printf escapes"},
		"non-ASCII":       {command: "echo ü", wantErr: "printf escapes"},
		"too long":        {command: "echo " + strings.Repeat("a", maxLine), wantErr: "too long"},
		"quotes too many": {command: strings.Repeat("'", maxLine/3), wantErr: "too long"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			line, peer := net.Pipe()
			defer line.Close()
			defer peer.Close()
			// Nothing may reach the line: a write would block on the pipe.
			_, code, err := Run(context.Background(), line, tc.command)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || code != -1 {
				t.Fatalf("Run() = %d, %v; want -1 and an error containing %q", code, err, tc.wantErr)
			}
		})
	}
}
