package rulefile

import (
	"fmt"
	"io"
	"os"
)

// readRuleFile reads the rule file at path through a limit: a path that is
// not a regular file once symlinks are followed (a device such as
// /dev/zero, a FIFO, a socket) is refused before it is opened for reading,
// a file over MaxFileSize is refused by its size, and no read takes more
// than MaxFileSize+1 bytes whatever the file does meanwhile. Errors name
// the path.
func readRuleFile(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, notRegular(path, st.Mode())
	}
	// Not blocking: were it replaced by a FIFO since the Stat, opening it
	// must not wait for a writer.
	f, err := os.OpenFile(path, os.O_RDONLY|openNonblock, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st, err = f.Stat(); err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, notRegular(path, st.Mode())
	}
	if st.Size() > MaxFileSize {
		return nil, &Error{File: path, Msg: fmt.Sprintf("the file is %d bytes, more than %d", st.Size(), MaxFileSize)}
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxFileSize {
		return nil, &Error{File: path, Msg: fmt.Sprintf("the file grew past %d bytes while read", MaxFileSize)}
	}
	return data, nil
}

// notRegular is the error for a rule file path that is not a regular file.
func notRegular(path string, m os.FileMode) error {
	what := "not a plain file"
	switch {
	case m&os.ModeDevice != 0:
		what = "a device"
	case m&os.ModeNamedPipe != 0:
		what = "a FIFO"
	case m&os.ModeSocket != 0:
		what = "a socket"
	case m.IsDir():
		what = "a directory"
	}
	return &Error{File: path, Msg: "not a regular file (" + what + "): rule files are plain files"}
}
