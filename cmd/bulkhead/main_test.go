package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fast is a tiny demo at 1000x speed.
var fast = []string{"-calls", "40", "-ramp", "1s", "-time-scale", "0.001", "-provider-concurrency", "8",
	"-max-concurrent", "7", "-max-queue", "2", "-queue-timeout", "2s", "-token-budget", "15000"}

func runArgs(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestDemoCommand(t *testing.T) {
	for name, args := range map[string][]string{
		"demo":       append([]string{"demo"}, fast...),
		"flags only": fast,
	} {
		code, out, errOut := runArgs(args...)
		if code != 0 || errOut != "" {
			t.Fatalf("%s: exit %d, stderr %q", name, code, errOut)
		}
		for _, want := range []string{"bulkhead demo: a burst of 40 gpt-4o calls", "provider 429s", "shed by the bulkhead", "Bare: the burst became a storm"} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: output lacks %q:\n%s", name, want, out)
			}
		}
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"help"}, {"--help"}} {
		code, out, _ := runArgs(args...)
		if code != 0 || !strings.Contains(out, "Commands:") || !strings.Contains(out, "demo") {
			t.Errorf("%v: exit %d, output %q", args, code, out)
		}
	}
	code, _, errOut := runArgs("demo", "-h")
	if code != 0 {
		t.Errorf("demo -h: exit %d", code)
	}
	for _, flag := range []string{"-calls", "-ramp", "-seed", "-time-scale", "-retries", "-provider-concurrency", "-provider-tpm", "-max-concurrent", "-max-queue", "-queue-timeout", "-token-budget"} {
		if !strings.Contains(errOut, flag) {
			t.Errorf("demo -h lacks %s:\n%s", flag, errOut)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"demo", "-no-such-flag"}, "flag provided but not defined"},
		{[]string{"demo", "-calls", "0"}, "-calls must be > 0"},
		{[]string{"demo", "extra"}, "unexpected arguments: extra"},
	} {
		code, out, errOut := runArgs(tc.args...)
		if code != 2 || out != "" || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 and %q", tc.args, code, out, errOut, tc.want)
		}
	}
}
