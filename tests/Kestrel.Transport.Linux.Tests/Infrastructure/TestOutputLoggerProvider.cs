using Microsoft.Extensions.Logging;

namespace Kestrel.Transport.Linux.Tests.Infrastructure;

/// <summary>
/// Writes server and transport log messages into the test's output, so a failing test shows what the
/// transport reported. Messages that arrive after the test finished (a loop thread logging late) are
/// dropped: xunit throws for them, and a logger must never throw into the transport.
/// </summary>
internal sealed class TestOutputLoggerProvider(ITestOutputHelper output, LogLevel minimumLevel = LogLevel.Information) : ILoggerProvider
{
    public ILogger CreateLogger(string categoryName) => new TestOutputLogger(output, categoryName, minimumLevel);

    public void Dispose()
    {
    }

    public static ILoggerFactory CreateFactory(ITestOutputHelper output, LogLevel minimumLevel = LogLevel.Information)
        => LoggerFactory.Create(builder =>
        {
            builder.SetMinimumLevel(minimumLevel);
            builder.AddProvider(new TestOutputLoggerProvider(output, minimumLevel));
        });

    private sealed class TestOutputLogger(ITestOutputHelper output, string category, LogLevel minimumLevel) : ILogger
    {
        public IDisposable? BeginScope<TState>(TState state)
            where TState : notnull => null;

        public bool IsEnabled(LogLevel logLevel) => logLevel >= minimumLevel;

        public void Log<TState>(LogLevel logLevel, EventId eventId, TState state, Exception? exception, Func<TState, Exception?, string> formatter)
        {
            if (!IsEnabled(logLevel))
            {
                return;
            }

            var line = $"{DateTime.UtcNow:HH:mm:ss.fff} [{logLevel}] {category}[{eventId.Id}]: {formatter(state, exception)}";
            if (exception is not null)
            {
                line += Environment.NewLine + exception;
            }

            try
            {
                output.WriteLine(line);
            }
            catch (InvalidOperationException)
            {
                // The test this output belongs to has finished.
            }
        }
    }
}
