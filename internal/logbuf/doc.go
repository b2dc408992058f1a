// Package logbuf is test glue: a buffer that log handlers on several
// goroutines may write while a test reads what was logged.
package logbuf
