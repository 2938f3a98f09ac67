using Microsoft.AspNetCore.Server.Kestrel.Core;

namespace TechEmpower.Tests.Units;

public sealed class SampleOptionsTests
{
    private static SampleOptions Parse(params string[] args)
    {
        Assert.True(SampleOptions.TryParse(args, out var options, out var error), error);
        return options;
    }

    private static string Fails(params string[] args)
    {
        Assert.False(SampleOptions.TryParse(args, out var options, out var error));
        Assert.Null(options);
        Assert.False(string.IsNullOrWhiteSpace(error));
        return error;
    }

    [Fact]
    public void No_arguments_give_the_defaults()
    {
        var options = Parse();
        Assert.Equal("http://*:8080", options.Urls);
        Assert.Equal(ListenUrlKind.AnyAddress, Assert.Single(options.ListenUrls).Kind);
        Assert.Equal(SampleTransport.Linux, options.Transport);
        Assert.Equal(SampleMode.Middleware, options.Mode);
        Assert.Null(options.Threads);
        Assert.Null(options.Scheduling);
        Assert.False(options.ShowHelp);
        Assert.Equal("linux", options.TransportName);
        Assert.Equal("middleware", options.ModeName);
    }

    [Fact]
    public void Urls_take_a_semicolon_separated_list_including_unix_sockets()
    {
        var options = Parse("--urls", "http://127.0.0.1:0;http://unix:/tmp/te.sock");
        Assert.Equal("http://127.0.0.1:0;http://unix:/tmp/te.sock", options.Urls);
        Assert.Collection(
            options.ListenUrls,
            u => Assert.Equal(ListenUrlKind.IPAddress, u.Kind),
            u => Assert.Equal("/tmp/te.sock", u.SocketPath));
    }

    [Theory]
    [InlineData("linux", SampleTransport.Linux, "linux")]
    [InlineData("sockets", SampleTransport.Sockets, "sockets")]
    [InlineData("sockets-inline", SampleTransport.SocketsInline, "sockets-inline")]
    [InlineData("libuv", SampleTransport.Libuv, "libuv")]
    [InlineData("LINUX", SampleTransport.Linux, "linux")]
    [InlineData("Sockets-Inline", SampleTransport.SocketsInline, "sockets-inline")]
    public void Transport_accepts_each_name(string value, SampleTransport expected, string name)
    {
        var options = Parse("--transport", value);
        Assert.Equal(expected, options.Transport);
        Assert.Equal(name, options.TransportName);
    }

    [Fact]
    public void Sockets_inline_always_schedules_inline()
    {
        var options = Parse("--transport", "sockets-inline");
        Assert.Equal(SampleScheduling.Inline, options.Scheduling);
        Assert.Equal(SampleScheduling.Inline, Parse("--transport", "sockets-inline", "--scheduling", "inline").Scheduling);
    }

    [Theory]
    [InlineData("--transport", "sockets", "--scheduling", "inline")]
    [InlineData("--scheduling", "inline", "--transport", "sockets")]
    public void Sockets_with_inline_scheduling_is_an_alias_of_sockets_inline(params string[] args)
    {
        var options = Parse(args);
        Assert.Equal(SampleTransport.SocketsInline, options.Transport);
        Assert.Equal(SampleScheduling.Inline, options.Scheduling);
    }

    [Fact]
    public void Sockets_with_threadpool_scheduling_stays_sockets()
    {
        var options = Parse("--transport", "sockets", "--scheduling", "threadpool");
        Assert.Equal(SampleTransport.Sockets, options.Transport);
        Assert.Equal(SampleScheduling.ThreadPool, options.Scheduling);
    }

    [Theory]
    [InlineData("1", 1)]
    [InlineData("16", 16)]
    [InlineData("1024", 1024)]
    public void Threads_accept_1_to_1024(string value, int expected) =>
        Assert.Equal(expected, Parse("--threads", value).Threads);

    [Theory]
    [InlineData("threadpool", SampleScheduling.ThreadPool)]
    [InlineData("inline", SampleScheduling.Inline)]
    [InlineData("Inline", SampleScheduling.Inline)]
    [InlineData("adaptive", SampleScheduling.Adaptive)]
    public void Scheduling_accepts_each_mode(string value, SampleScheduling expected) =>
        Assert.Equal(expected, Parse("--scheduling", value).Scheduling);

    [Theory]
    [InlineData("middleware", SampleMode.Middleware, "middleware")]
    [InlineData("platform", SampleMode.Platform, "platform")]
    [InlineData("PLATFORM", SampleMode.Platform, "platform")]
    public void Mode_accepts_each_mode(string value, SampleMode expected, string name)
    {
        var options = Parse("--mode", value);
        Assert.Equal(expected, options.Mode);
        Assert.Equal(name, options.ModeName);
    }

    [Theory]
    [InlineData("epoll", Kestrel.Transport.Linux.IoBackend.Epoll)]
    [InlineData("aio", Kestrel.Transport.Linux.IoBackend.EpollAio)]
    [InlineData("AIO", Kestrel.Transport.Linux.IoBackend.EpollAio)]
    public void Io_accepts_each_backend(string value, Kestrel.Transport.Linux.IoBackend expected) =>
        Assert.Equal(expected, Parse("--io", value).Io);

    /// <summary>Unset, Kestrel keeps its default (Http1AndHttp2, which without TLS serves HTTP/1.1 only).</summary>
    [Theory]
    [InlineData(null, null)]
    [InlineData("http1", HttpProtocols.Http1)]
    [InlineData("http2", HttpProtocols.Http2)]
    [InlineData("Http1AndHttp2", HttpProtocols.Http1AndHttp2)]
    public void Protocols_accepts_each_set_of_versions(string? value, HttpProtocols? expected) =>
        Assert.Equal(expected, (value is null ? Parse() : Parse("--protocols", value)).Protocols);

    [Fact]
    public void Https_urls_take_a_certificate_by_path_with_its_key_and_password()
    {
        var options = Parse("--urls", "https://127.0.0.1:0;http://127.0.0.1:0", "--certificate", "/tmp/c.pem", "--certificate-key=/tmp/k.pem",
            "--certificate-password", "");
        Assert.True(options.UsesHttps);
        Assert.Equal("/tmp/c.pem", options.Certificate);
        Assert.Equal("/tmp/k.pem", options.CertificateKey);
        Assert.Equal("", options.CertificatePassword);
    }

    [Fact]
    public void Https_without_a_certificate_leaves_it_to_the_self_signed_one()
    {
        var options = Parse("--urls", "https://*:8443");
        Assert.True(options.UsesHttps);
        Assert.Null(options.Certificate);
        Assert.Null(options.CertificateKey);
        Assert.Null(options.CertificatePassword);
        Assert.False(Parse().UsesHttps);
    }

    [Fact]
    public void Https_and_http2_only_go_together()
    {
        var options = Parse("--urls", "https://127.0.0.1:0", "--protocols", "http2", "--transport", "sockets");
        Assert.True(options.UsesHttps);
        Assert.Equal(HttpProtocols.Http2, options.Protocols);
    }

    [Theory]
    [InlineData("http://127.0.0.1:8081/json")]
    [InlineData("https://localhost:8443/plaintext?x=1")]
    public void Downstream_takes_an_absolute_http_or_https_url(string url) =>
        Assert.Equal(new Uri(url), Parse("--downstream", url).Downstream);

    [Fact]
    public void Downstream_is_unset_by_default() => Assert.Null(Parse().Downstream);

    [Fact]
    public void Io_and_tuning_are_unset_by_default()
    {
        var options = Parse();
        Assert.Null(options.Io);
        Assert.Null(options.Tuning);
    }

    [Fact]
    public void Tuning_is_kept_as_given_once_it_parses() =>
        Assert.Equal("SendFromThreadPool=false,MaxBytesPerRead=4096", Parse("--tuning", "SendFromThreadPool=false,MaxBytesPerRead=4096").Tuning);

    [Theory]
    [InlineData("--help")]
    [InlineData("-h")]
    [InlineData("-?")]
    public void Help_is_recognised(string flag) => Assert.True(Parse(flag).ShowHelp);

    [Fact]
    public void Equals_form_and_the_last_repeat_win()
    {
        var options = Parse("--threads=2", "--mode=platform", "--threads", "3", "--transport=sockets");
        Assert.Equal(3, options.Threads);
        Assert.Equal(SampleMode.Platform, options.Mode);
        Assert.Equal(SampleTransport.Sockets, options.Transport);
    }

    [Fact]
    public void Usage_describes_every_option_and_value()
    {
        foreach (var text in new[]
        {
            "--urls", "--transport", "--threads", "--scheduling", "--io", "--tuning", "--mode", "--protocols", "--help", "epoll", "aio",
            "--certificate PATH", "--certificate-key PATH", "--certificate-password", "--downstream URL", "https://", "/await",
            "linux", "sockets", "sockets-inline", "libuv", "threadpool", "inline", "middleware", "platform", "http1andhttp2",
            "http://unix:/PATH", "DOTNET_SYSTEM_NET_SOCKETS_INLINE_COMPLETIONS",
        })
        {
            Assert.Contains(text, SampleOptions.Usage, StringComparison.Ordinal);
        }
    }

    [Theory]
    [InlineData("Unknown option '--bogus'", "--bogus", "1")]
    [InlineData("Unexpected argument 'serve'", "serve")]
    [InlineData("Unexpected argument '--'", "--")]
    [InlineData("Option '--threads' needs a value", "--threads")]
    [InlineData("Option '--urls' needs at least one URL", "--urls", " ")]
    [InlineData("Option '--urls' needs at least one URL", "--urls", ";")]
    [InlineData("Unknown transport 'libuv2'", "--transport", "libuv2")]
    [InlineData("Unknown transport ''", "--transport=")]
    [InlineData("Unknown scheduling 'fast'", "--scheduling", "fast")]
    [InlineData("Unknown mode 'raw'", "--mode", "raw")]
    [InlineData("Invalid thread count '0'", "--threads", "0")]
    [InlineData("Invalid thread count '-1'", "--threads", "-1")]
    [InlineData("Invalid thread count '1025'", "--threads", "1025")]
    [InlineData("Invalid thread count 'two'", "--threads", "two")]
    [InlineData("Invalid thread count ' 2'", "--threads", " 2")]
    [InlineData("always schedules inline", "--transport", "sockets-inline", "--scheduling", "threadpool")]
    [InlineData("does not apply to the libuv transport", "--transport", "libuv", "--scheduling", "inline")]
    [InlineData("Scheduling 'adaptive' is the linux transport's", "--transport", "sockets", "--scheduling", "adaptive")]
    [InlineData("Unknown I/O backend 'uring'", "--io", "uring")]
    [InlineData("unknown tuning switch 'OneShotRegistrations'", "--tuning", "OneShotRegistrations=true")]
    [InlineData("'maybe' is not true or false", "--tuning", "DeferSend=maybe")]
    [InlineData("apply to the linux transport only", "--transport", "sockets", "--io", "aio")]
    [InlineData("apply to the linux transport only", "--transport", "libuv", "--tuning", "DeferSend=false")]
    [InlineData("Platform mode serves plain HTTP only", "--mode", "platform", "--urls", "https://127.0.0.1:8443")]
    [InlineData("Platform mode serves plain HTTP only", "--urls", "http://127.0.0.1:8080;https://127.0.0.1:8443", "--mode", "platform")]
    [InlineData("not over TLS", "--urls", "https://unix:/tmp/te.sock")]
    [InlineData("Option '--certificate' needs a file path", "--urls", "https://*:8443", "--certificate=")]
    [InlineData("Option '--certificate-key' needs a file path", "--urls", "https://*:8443", "--certificate", "c.pem", "--certificate-key", " ")]
    [InlineData("need '--certificate'", "--urls", "https://*:8443", "--certificate-key", "key.pem")]
    [InlineData("need '--certificate'", "--urls", "https://*:8443", "--certificate-password", "pw")]
    [InlineData("needs an https:// URL", "--certificate", "server.pfx")]
    [InlineData("needs an https:// URL", "--urls", "http://127.0.0.1:0", "--certificate", "server.pfx")]
    [InlineData("Invalid downstream 'localhost:8081'", "--downstream", "localhost:8081")]
    [InlineData("Invalid downstream '/json'", "--downstream", "/json")]
    [InlineData("Invalid downstream 'ftp://127.0.0.1/json'", "--downstream", "ftp://127.0.0.1/json")]
    [InlineData("applies to middleware mode only", "--mode", "platform", "--downstream", "http://127.0.0.1:8081/json")]
    [InlineData("localhost needs a fixed port", "--mode", "platform", "--urls", "http://localhost:0")]
    [InlineData("Unknown protocols 'h2c'", "--protocols", "h2c")]
    [InlineData("applies to middleware mode only", "--mode", "platform", "--protocols", "http2")]
    public void Bad_command_lines_are_refused_with_a_message_naming_the_problem(string message, params string[] args) =>
        Assert.Contains(message, Fails(args), StringComparison.Ordinal);

    [Fact]
    public void Urls_are_checked_in_middleware_mode_too() =>
        Assert.Contains("the host must be", Fails("--urls", "http://example.com:80"), StringComparison.Ordinal);
}
