using System.Collections.Concurrent;
using Microsoft.Extensions.Logging;

namespace Kestrel.Transport.Linux.Tests.Infrastructure;

/// <summary>Keeps every log line a host writes at Information and above, as "Level Category: message".</summary>
internal sealed class LogLines : ILoggerProvider
{
    private readonly ConcurrentQueue<string> _lines = new();

    public IReadOnlyCollection<string> Lines => _lines.ToArray();

    /// <summary>The lines of one category, messages only.</summary>
    public IReadOnlyList<string> Of(string category) =>
        [.. Lines.Where(l => l.Contains($" {category}: ", StringComparison.Ordinal)).Select(l => l[(l.IndexOf(": ", StringComparison.Ordinal) + 2)..])];

    public ILogger CreateLogger(string categoryName) => new Logger(this, categoryName);

    public void Dispose()
    {
    }

    private sealed class Logger(LogLines lines, string category) : ILogger
    {
        public IDisposable? BeginScope<TState>(TState state)
            where TState : notnull => null;

        public bool IsEnabled(LogLevel logLevel) => logLevel >= LogLevel.Information;

        public void Log<TState>(LogLevel logLevel, EventId eventId, TState state, Exception? exception, Func<TState, Exception?, string> formatter)
        {
            if (IsEnabled(logLevel))
            {
                lines._lines.Enqueue($"{logLevel} {category}: {formatter(state, exception)}");
            }
        }
    }
}
