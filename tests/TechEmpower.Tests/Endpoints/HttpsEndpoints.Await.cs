using System.Net;
using System.Text;
using TechEmpower.Tests.Infrastructure;

namespace TechEmpower.Tests.Endpoints;

/// <summary>GET /await, against the fixture's <see cref="Downstream"/>: a downstream call per request, awaited.</summary>
public abstract partial class HttpsEndpoints<TFixture>
{
    [Fact]
    public async Task Await_answers_with_the_downstream_json_over_http_and_https()
    {
        Sample.Downstream.Answer = DownstreamAnswer.Json;
        var before = Sample.Downstream.Requests;

        foreach (var client in new[] { Sample.Http, Sample.Https1 })
        {
            using var response = await client.GetAsync(new Uri("/await", UriKind.Relative));
            var body = await TechEmpowerRules.VerifyAsync(response, "application/json");
            Assert.Equal(HelloWorldJson, Encoding.UTF8.GetString(body));
        }

        Assert.Equal(before + 2, Sample.Downstream.Requests);
    }

    [Fact]
    public async Task Await_passes_on_the_downstream_content_type_whole()
    {
        Sample.Downstream.Answer = DownstreamAnswer.Text;
        using var response = await Sample.Https2.GetAsync(new Uri("/await", UriKind.Relative));

        Assert.Equal(HttpStatusCode.OK, response.StatusCode);
        Assert.Equal(Downstream.TextContentType, response.Content.Headers.ContentType?.ToString());
        Assert.Equal(Downstream.TextBody.Length, response.Content.Headers.ContentLength);
        Assert.Equal(Downstream.TextBody, await response.Content.ReadAsStringAsync());
    }

    /// <summary>A client per request would open a connection per call; the shared one keeps its connection alive.</summary>
    [Fact]
    public async Task Await_calls_in_a_row_reuse_one_pooled_downstream_connection()
    {
        Sample.Downstream.Answer = DownstreamAnswer.Json;
        using (var warm = await Sample.Http.GetAsync(new Uri("/await", UriKind.Relative)))
        {
            Assert.Equal(HttpStatusCode.OK, warm.StatusCode);
        }

        var connections = Sample.Downstream.Connections;
        for (var i = 0; i < 8; i++)
        {
            using var response = await Sample.Http.GetAsync(new Uri("/await", UriKind.Relative));
            Assert.Equal(HttpStatusCode.OK, response.StatusCode);
        }

        Assert.Equal(connections, Sample.Downstream.Connections);
    }

    [Fact]
    public async Task Await_answers_502_when_the_downstream_fails()
    {
        Sample.Downstream.Answer = DownstreamAnswer.ServerError;
        using var response = await Sample.Http.GetAsync(new Uri("/await", UriKind.Relative));

        Assert.Equal(HttpStatusCode.BadGateway, response.StatusCode);
        Assert.Equal("downstream answered 500", await response.Content.ReadAsStringAsync());
    }

    /// <summary>The client leaves while its request awaits the downstream: the downstream call is cancelled with it.</summary>
    [Fact]
    public async Task Await_cancels_the_downstream_call_when_the_client_goes_away()
    {
        Sample.Downstream.Answer = DownstreamAnswer.Hang;
        Sample.Downstream.ResetSignals();
        using var cts = new CancellationTokenSource(TestTimeouts.Request);
        using (var connection = await RawHttpConnection.ConnectAsync(Sample.HttpUrl, cts.Token))
        {
            await connection.SendAsync(RawHttpRequest.Get("/await"), cts.Token);
            await Sample.Downstream.Hanging.WaitAsync(cts.Token);
        }

        var abandoned = await Task.WhenAny(Sample.Downstream.Abandoned, Task.Delay(TestTimeouts.Request));
        Assert.True(abandoned == Sample.Downstream.Abandoned,
            $"The downstream call was still waiting {TestTimeouts.Request} after the client had gone.{Environment.NewLine}{Sample.Sample.Output}");
    }
}
