using System.Diagnostics.CodeAnalysis;
using System.Globalization;

namespace TechEmpower;

/// <summary>The transport the sample runs Kestrel on.</summary>
public enum SampleTransport
{
    /// <summary>Kestrel.Transport.Linux (the default).</summary>
    Linux,

    /// <summary>Kestrel's built-in Sockets transport, for comparison.</summary>
    Sockets,
}

/// <summary>Where application continuations run.</summary>
public enum SampleScheduling
{
    /// <summary>Continuations are queued to the .NET thread pool.</summary>
    ThreadPool,

    /// <summary>
    /// Continuations run on the I/O thread: the Linux transport's Inline mode, or the Sockets
    /// transport's <c>UnsafePreferInlineScheduling</c>.
    /// </summary>
    Inline,
}

/// <summary>
/// The sample's command line: <c>--urls URL</c>, <c>--transport linux|sockets</c>,
/// <c>--threads N</c>, <c>--scheduling threadpool|inline</c>, <c>--help</c>.
/// Both <c>--name value</c> and <c>--name=value</c> are accepted; a repeated option keeps its last value.
/// </summary>
public sealed class SampleOptions
{
    /// <summary>The URLs served when <c>--urls</c> is not given.</summary>
    public const string DefaultUrls = "http://*:8080";

    /// <summary>The largest accepted <c>--threads</c> value (the Linux transport's own limit).</summary>
    public const int MaxThreads = 1024;

    /// <summary>The exit code for a command line that cannot be parsed.</summary>
    public const int UsageExitCode = 2;

    /// <summary>The text printed by <c>--help</c> and after a command-line error.</summary>
    public const string Usage =
        """
        Usage: TechEmpower [options]

          --urls URL[;URL...]            Addresses to listen on (default: http://*:8080).
          --transport linux|sockets      Kestrel transport (default: linux).
          --threads N                    Linux: ThreadCount (event-loop threads);
                                         sockets: IOQueueCount. Default: the transport's own.
          --scheduling threadpool|inline Linux: ApplicationSchedulingMode; sockets: inline sets
                                         UnsafePreferInlineScheduling and inline socket completions.
                                         Default: the transport's own (thread pool).
          -h, --help                     Show this help.

        Other Linux transport options bind from configuration, for example the environment variable
        Kestrel__LinuxTransport__AioReceive=true.
        """;

    /// <summary>The URLs to listen on, separated by ';'.</summary>
    public string Urls { get; private set; } = DefaultUrls;

    /// <summary>The transport to use.</summary>
    public SampleTransport Transport { get; private set; } = SampleTransport.Linux;

    /// <summary>The number of I/O threads, or null for the transport's default.</summary>
    public int? Threads { get; private set; }

    /// <summary>The scheduling mode, or null for the transport's default.</summary>
    public SampleScheduling? Scheduling { get; private set; }

    /// <summary>True when <c>--help</c> was given: print <see cref="Usage"/> and exit 0.</summary>
    public bool ShowHelp { get; private set; }

    /// <summary>Parses the command line.</summary>
    /// <param name="args">The arguments, without the program name.</param>
    /// <param name="options">The parsed options, when parsing succeeded.</param>
    /// <param name="error">A one-line message naming the bad argument, when parsing failed.</param>
    /// <returns>True when every argument was understood.</returns>
    public static bool TryParse(
        IReadOnlyList<string> args,
        [NotNullWhen(true)] out SampleOptions? options,
        [NotNullWhen(false)] out string? error)
    {
        ArgumentNullException.ThrowIfNull(args);

        var result = new SampleOptions();
        options = null;
        error = null;

        for (var i = 0; i < args.Count; i++)
        {
            var arg = args[i];
            if (arg is "-h" or "--help" or "-?")
            {
                result.ShowHelp = true;
                continue;
            }

            if (!arg.StartsWith("--", StringComparison.Ordinal) || arg.Length == 2)
            {
                error = $"Unexpected argument '{arg}'.";
                return false;
            }

            string name;
            string? value;
            var equals = arg.IndexOf('=', StringComparison.Ordinal);
            if (equals >= 0)
            {
                name = arg[2..equals];
                value = arg[(equals + 1)..];
            }
            else
            {
                name = arg[2..];
                value = i + 1 < args.Count ? args[++i] : null;
            }

            if (value is null)
            {
                error = $"Option '--{name}' needs a value.";
                return false;
            }

            switch (name.ToUpperInvariant())
            {
                case "URLS":
                    if (string.IsNullOrWhiteSpace(value))
                    {
                        error = "Option '--urls' needs at least one URL.";
                        return false;
                    }

                    result.Urls = value;
                    break;

                case "TRANSPORT":
                    switch (value.ToUpperInvariant())
                    {
                        case "LINUX":
                            result.Transport = SampleTransport.Linux;
                            break;
                        case "SOCKETS":
                            result.Transport = SampleTransport.Sockets;
                            break;
                        default:
                            error = $"Unknown transport '{value}': expected 'linux' or 'sockets'.";
                            return false;
                    }

                    break;

                case "THREADS":
                    if (!int.TryParse(value, NumberStyles.None, CultureInfo.InvariantCulture, out var threads)
                        || threads is < 1 or > MaxThreads)
                    {
                        error = $"Invalid thread count '{value}': expected a whole number from 1 to {MaxThreads}.";
                        return false;
                    }

                    result.Threads = threads;
                    break;

                case "SCHEDULING":
                    switch (value.ToUpperInvariant())
                    {
                        case "THREADPOOL":
                            result.Scheduling = SampleScheduling.ThreadPool;
                            break;
                        case "INLINE":
                            result.Scheduling = SampleScheduling.Inline;
                            break;
                        default:
                            error = $"Unknown scheduling '{value}': expected 'threadpool' or 'inline'.";
                            return false;
                    }

                    break;

                default:
                    error = $"Unknown option '--{name}'.";
                    return false;
            }
        }

        options = result;
        return true;
    }
}
