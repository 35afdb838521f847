#!/usr/bin/env bash
# check-comments.sh - fails when a comment names a function that does not exist:
# every identifier written as a call in a comment, `foo()`, must occur as an
# identifier in the code (comments and strings left out) of some file of the
# tree, or be a name the system provides (the C library, POSIX, FUSE, Vulkan,
# CUDA: any identifier the code itself uses counts, so `read()` passes where the
# tree calls read), or one of FOREIGN: functions of the languages and programs
# the code mirrors, named as such (Python's repr(), llama.cpp's permute()).
# Project names (jlm_*, jlmfs_*, JLM_*) must exist even when not written as
# calls. Run by .ci/run.
# Usage: scripts/check-comments.sh   (from anywhere; one line per stale name)
set -euo pipefail
cd "$(dirname "$0")/.."
FOREIGN="repr permute"

git ls-files --cached --others --exclude-standard '*.c' '*.h' '*.cu' '*.comp' '*.glsl' |
    FOREIGN=$FOREIGN perl -e '
    my (%code, @calls);
    $code{$_} = 1 for split " ", $ENV{FOREIGN};
    while (my $f = <STDIN>) {
        chomp $f;
        open(my $h, "<", $f) or die "$f: $!";
        my $src = do { local $/; <$h> };
        close $h;
        # split into code and comments, strings and character literals dropped
        my $code = "";
        while ($src =~ m{\G(?:(/\*.*?\*/)|(//[^\n]*)|("(?:\\.|[^"\\\n])*")|(\x27(?:\\.|[^\x27\\\n])*\x27)|(.[^/"\x27]*))}gs) {
            my ($block, $line, $str, $chr, $rest) = ($1, $2, $3, $4, $5);
            my $c = defined $block ? $block : $line;
            if (defined $c) {
                my $lineno = 1 + (substr($src, 0, $-[0]) =~ tr/\n//);
                my @lines = split /\n/, $c, -1;
                for my $i (0 .. $#lines) {
                    while ($lines[$i] =~ /(?<![\w.>:])([A-Za-z_]\w*)\(\)/g) {
                        push @calls, [$f, $lineno + $i, $1, "()"];
                    }
                    # a name with the project prefix, call or not (not a
                    # pattern like jlm_tok_*, a file like jlm_err.h, a prefix)
                    while ($lines[$i] =~ /(?<![\w.\/-])((?:jlm|jlmfs|JLM)_\w*[A-Za-z0-9])(?![\w*(]|\.[a-z]|-|_\*)/g) {
                        push @calls, [$f, $lineno + $i, $1, ""];
                    }
                }
                $code .= " ";
            } elsif (defined $rest) {
                $code .= $rest;
            } else {
                $code .= " $str$chr ";   # a name in a string exists too (getenv("JLM_BIN"))
            }
        }
        $code{$_} = 1 for $code =~ /([A-Za-z_]\w*)/g;
    }
    my $bad = 0;
    for my $c (@calls) {
        my ($f, $l, $name, $paren) = @$c;
        next if $code{$name};
        print "$f:$l: comment names $name$paren, which no code in the tree has\n";
        $bad = 1;
    }
    print "check-comments: every function a comment names exists\n" unless $bad;
    exit $bad;
    '
